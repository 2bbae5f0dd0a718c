"""Devices and the mesh: the (data, fsdp, tensor, expert) mesh with the model's logical axis
rules in context (mesh.py), and the one rule about JAX's compilation cache that depends on it
(xla_cache.py). Below the run directory and the trainer, which both place arrays on a mesh."""
