"""Training one run: the optimiser (with muP learning-rate multipliers), the pure train step,
the held-out evaluation it logs (eval_loss.py, answers.py), the loop (trainer.py)."""
