"""The command line: `python run.py dataset=chest_xray [key=value ...]`, or `-m` for a sweep; installed as
`tf-harness` (this file is `tf_harness.run`).

Hydra composes the config from conf/; experiments/run_dir/reentry.py resolves the config a run runs (a
re-entered run directory's saved one); experiments/cli.py checks it before TensorFlow starts, turns
failures into one line and the exit status; then experiments/runner.py trains and evaluates.
"""
import sys

from tf_harness.experiments import cli

# The entry point's one call, before TensorFlow or Hydra starts: environment, warnings, log levels and the
# config's resolvers (a launcher's job process imports this module too). Nothing imports TensorFlow before the
# config has passed its check, so a bad config is reported in about a second.
cli.setup()

import hydra  # noqa: E402


# A sweep (-m), and Hydra's own flags (--cfg, --help, ...): Hydra's main. conf/ is the package tf_harness.conf, so
# the same configs are found in a checkout and when installed.
@hydra.main(config_path="pkg://tf_harness.conf", config_name="config", version_base="1.3")
def main(cfg):
    # Each job of a sweep: the config resolved (on re-entry: the saved config, changed only where allowed), checked,
    # then experiments/runner.py's `run`; the job's outcome goes to Optuna (experiments/sweeps/sweep_report.py).
    return cli.job(cli.train_and_evaluate, cfg)


def compose_and_run():
    """A single run, new or re-entering its run directory (docs/run-directory.md), takes the call experiments/api.py
    takes (cli.single_run); a sweep and Hydra's flags take Hydra's main, which reads sys.argv itself."""
    args = sys.argv[1:]
    if cli.hydra_main_needed(args):
        main()
    else:
        cli.single_run(args, cli.train_and_evaluate)


def command() -> int:
    """`tf-harness dataset=chest_xray [key=value ...]`, or `-m` for a sweep; returns the exit status."""
    # Inside cli.exit_code, so that what compose_and_run raises (a path too long, a Hydra error) becomes the exit
    # status, and after it has refused a run directory whose saved config is unreadable.
    return cli.exit_code(compose_and_run)


if __name__ == "__main__":
    sys.exit(command())
