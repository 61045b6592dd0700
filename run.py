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

from tf_harness.experiments.run_dir import reentry


# The run's config (docs/run-directory.md). A new run runs what Hydra composes from conf/ and the command line;
# re-entering a recorded run directory (hydra.run.dir=<run>) runs the run's saved .hydra/config.yaml, changed
# only in the command line's run-control keys. Resolving it takes two calls, because they sit on either side of
# Hydra's composition: Hydra refuses a key of a group it did not compose (LFW's model.merge, say), so the run's
# saved dataset=, model= and experiment= go on the command line before Hydra reads it (compose_and_run); the
# typed overrides can be compared with the saved config only once Hydra has parsed them and made the job's run
# directory, in each job of a sweep (main, through cli.job).


# conf/ is the package tf_harness.conf, so the same configs are found in a checkout and when installed.
@hydra.main(config_path="pkg://tf_harness.conf", config_name="config", version_base="1.3")
def main(cfg):
    # The job below the command line, which a sweep's jobs and experiments/api.py's `run` share: the config resolved
    # (on re-entry: the saved config, or what may not change), checked, then experiments/runner.py's `run`.
    return cli.job(cli.train_and_evaluate, cfg)  # the job's outcome: for Optuna, experiments/sweep_report.py


def compose_and_run():
    # On re-entry: the groups the command line does not name, as the run chose them.
    sys.argv[1:] = reentry.with_saved_choices(sys.argv[1:])
    main()  # Hydra reads sys.argv here


def command() -> int:
    """`tf-harness dataset=chest_xray [key=value ...]`, or `-m` for a sweep; returns the exit status."""
    # Inside cli.exit_code, so that what compose_and_run raises (a path too long, a Hydra error) becomes the exit
    # status, and after it has refused a run directory whose saved config is unreadable.
    return cli.exit_code(compose_and_run)


if __name__ == "__main__":
    sys.exit(command())
