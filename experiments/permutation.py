"""Forward permutation traversal (PAPERS.md section 3): looped 4 x 8 against unshared 32 layers.

    loopscale flops --config=experiments/permutation.py:tiny
    loopscale flops --config=experiments/permutation.py:paper

`paper` is the looped model (4-layer block iterated 8 times); the unshared baseline is
`--config.model.n_unique=32 --config.model.n_loops=1`. `tiny` is a 2 x 2 model for smoke tests.
Both read 16 nodes and 8 hops: vocabulary 27 (16 nodes, PAD, BOS, QUERY, 8 hop counts) and
sequences of 36 tokens (data/permutation.py documents the format). The vocabulary and the
sequence length follow `--config.data.n_nodes` / `--config.data.hops_max` overrides.
"""

from ml_collections import ConfigDict

from loopscale.config import base_config, presets
from loopscale.data import permutation


def get_config(arg: str | None = "tiny") -> ConfigDict:
    c = base_config()
    c.name = "permutation"
    m = c.model
    m.injection = "repeat"
    m.mlp = "swiglu"
    m.param = "sp"
    c.data.source = "permutation"
    c.data.n_nodes, c.data.hops_min, c.data.hops_max = 16, 8, 8
    # Field references, so that overriding n_nodes or hops_max on the command line moves the
    # vocabulary and the sequence length with it (the task needs exactly these sizes).
    n_nodes, hops_max = c.data.get_ref("n_nodes"), c.data.get_ref("hops_max")
    m.vocab_size = permutation.vocab_size(n_nodes, hops_max)
    c.train.seq_len = permutation.seq_len(n_nodes)
    if arg == "paper":
        m.d_model, m.n_heads, m.n_unique, m.n_loops = 256, 4, 4, 8
        c.train.steps, c.train.batch_size = 20000, 64
        m.dtype = "bfloat16"  # activations, as the other paper presets
        c.train.log_every = presets.PAPER_LOG_EVERY
    else:
        m.d_model, m.n_heads, m.n_unique, m.n_loops = 64, 1, 2, 2
        c.train.steps, c.train.batch_size = 50, 16
    c.train.lr = 1e-3
    return c
