"""Entry point in a checkout: `python run.py dataset=chest_xray [key=value ...]`, or `-m` for a sweep.

The same as the installed `tf-harness` command (experiments/cli.py).
"""
import sys

from tf_harness.experiments import cli

if __name__ == "__main__":
    sys.exit(cli.command())
