"""The command line: `python run.py dataset=chest_xray [key=value ...]`, or `-m` for a sweep; installed as
`tf-harness` (this file is `tf_harness.run`).

Hydra composes the config from conf/; experiments/cli.py checks it before TensorFlow starts, turns
failures into one line and the exit status; then experiments/runner.py trains and evaluates.
"""
import sys

# First: it sets TensorFlow's and Hydra's environment before either is imported. It imports no TensorFlow,
# so a bad config is reported in about a second.
from tf_harness.experiments import cli

import hydra


def train_and_evaluate(cfg):
    from tf_harness.experiments import runner  # TensorFlow starts here, once cli.guarded has passed the config

    return runner.run(cfg)  # the headline validation metric, or None


# conf/ is the package tf_harness.conf, so the same configs are found in a checkout and when installed.
@hydra.main(config_path="pkg://tf_harness.conf", config_name="config", version_base="1.3")
def main(cfg):
    return cli.guarded(train_and_evaluate, cfg)  # the job's outcome: for Optuna, and experiments/sweep_report.py


def command() -> int:
    """`tf-harness dataset=chest_xray [key=value ...]`, or `-m` for a sweep; returns the exit status."""
    return cli.exit_code(main)


if __name__ == "__main__":
    sys.exit(command())
