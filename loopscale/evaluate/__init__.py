"""Evaluators: what reads a model (or a trained run's parameters) and measures it, apart from
the training loop.

- `lm`: held-out LM loss at every loop exit, micro-batched (the trainer's `eval_loss`);
- `xla_cost`: XLA's count of the compiled training step (`loopscale flops`, tests/test_flops.py);
- `coordcheck`: the muP coordinate check across widths (`loopscale coordcheck`);
- `suite`, `measures` and one module per measurement: `loopscale eval --workdir=DIR`, the
  studies' measurements of a trained run directory (measures.py lists them).

The submodules import jax and the model; nothing is imported here, so `import
loopscale.evaluate` stays cheap and each caller pulls in only what it uses.
"""
