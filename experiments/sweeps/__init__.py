"""Sweeps: the Optuna study and sweeper, sweep folders, pruning, the sweep report and the HParams record."""
