"""loopscale: scaling-law experiments on looped transformers in JAX/Flax."""

__version__ = "0.1.0"
