"""The run directory's durability: its lock, re-entry, checkpoint selection, leftovers of a killed run,
interrupts, the input iterator's record, and OS errors worded for the user."""
