"""Training: the Trainer and its step, the loop's actions, recipes, optimizers, warm start, XLA's cache."""
