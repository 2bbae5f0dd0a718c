"""Config loading and validation: experiment files, overrides, one-line errors."""

import pytest

from loopscale.config import FFNKind, Injection, load_config, parse
from loopscale.errors import UsageError

EXPERIMENTS = ["base", "looped", "moe", "looped_moe", "flt", "permutation"]


@pytest.mark.parametrize("name", EXPERIMENTS)
@pytest.mark.parametrize("arg", ["tiny", "paper"])
def test_every_experiment_parses(name, arg):
    cfg = parse(load_config(f"experiments/{name}.py:{arg}"))
    assert cfg.model.d_model > 0 and cfg.train.steps > 0


def test_overrides_are_typed_and_become_enums():
    cfg = parse(load_config("experiments/flt.py:tiny", ["--config.model.injection=fla",
                                                         "--config.model.n_loops=12",
                                                         "--config.model.ffn=moe"]))
    assert cfg.model.injection is Injection.FLA and cfg.model.n_loops == 12
    assert cfg.model.ffn is FFNKind.MOE


def test_paper_sizes_are_the_studies():
    flt = parse(load_config("experiments/flt.py:paper")).model
    assert (flt.d_model, flt.n_heads, flt.d_head, flt.n_unique) == (768, 6, 128, 12)
    lm = parse(load_config("experiments/looped_moe.py:paper")).model
    assert (lm.n_unique, lm.n_loops, lm.n_experts, lm.top_k, lm.d_model) == (8, 2, 8, 2, 704)


@pytest.mark.parametrize("override,needle", [
    ("--config.model.no_such_field=1", "no_such_field"),
    ("--config.model.d_model=abc", "d_model"),
    ("--config.model.injection=sideways", "injection"),
    ("--config.model.head_dim=7", "head size"),
    ("--config.model.top_k=9", "top_k"),
])
def test_bad_input_is_one_line_naming_the_field(override, needle):
    with pytest.raises(UsageError) as err:
        parse(load_config("experiments/moe.py:tiny", [override]))
    message = str(err.value)
    assert needle in message and "\n" not in message


def test_enum_error_lists_allowed_values():
    with pytest.raises(UsageError, match="none, input, attn_first, fla, flt"):
        parse(load_config("experiments/flt.py:tiny", ["--config.model.injection=sideways"]))


def test_missing_file_is_a_usage_error():
    with pytest.raises(UsageError, match="no such file"):
        load_config("experiments/nope.py:tiny")
