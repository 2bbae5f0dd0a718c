"""Training: optimiser (with muP learning-rate multipliers); the trainer grows here."""
