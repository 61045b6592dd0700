"""Entry point: `python run.py dataset=chest_xray [key=value ...]`, or `-m` for a sweep."""
import sys

import hydra

from experiments import cli, runner


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def main(cfg):
    cli.guarded(runner.run, cfg)


if __name__ == "__main__":
    sys.exit(cli.exit_code(main))
