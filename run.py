"""Entry point: `python run.py dataset=chest_xray [key=value ...]`, or `-m` for a sweep."""
import sys

import hydra

from experiments import cli


def train_and_evaluate(cfg):
    from experiments import runner  # TensorFlow starts here, once cli has checked the config

    return runner.run(cfg)  # the headline validation metric, or None


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg):
    return cli.guarded(train_and_evaluate, cfg)  # the job's outcome: for Optuna, and experiments/sweep_report.py


if __name__ == "__main__":
    sys.exit(cli.exit_code(main))
