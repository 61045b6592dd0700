"""A run called from Python: `run(overrides, run_dir)` does what `python run.py <overrides> hydra.run.dir=<run_dir>`
does, in this process, and returns the final metrics.

    from tf_harness.experiments import api
    api.run(["dataset=lfw_pairs", "experiment=smoke"], run_dir="runs/r")  # trains: {"accuracy": ..., ...}
    api.run(["mode=evaluate"], run_dir="runs/r")  # evaluates its newest checkpoint again

It starts the run as the command line starts a single one, with the same call (experiments/cli.py `single_run`:
Hydra's compose API, then one Hydra job), so the run directory is the same (.hydra/, run.log, checkpoints, events,
metrics.json), and below it the same function, experiments/cli.py `job`: the re-entry resolution of a saved
config, the schema check, then experiments/runner.py. Importing this module imports neither TensorFlow nor Hydra;
a run starts TensorFlow as the command line does, once its config has passed the check.
"""
import contextlib
import gc
import logging
import signal

from tf_harness.data.errors import ConfigError


class RunConfigError(ConfigError):
    """The run's config is wrong; the message is the line the command line prints (`config error: ...`), naming the
    key and what is allowed. The command line exits 2 on it."""


class RunFailed(RuntimeError):
    """The run failed for another reason (its data, a non-finite loss, an unrestorable checkpoint, the disk); the
    message is the line the command line prints (`error: ...`), and `status` its exit status (1)."""

    def __init__(self, line, status=1):
        super().__init__(line)
        self.status = status


def run(overrides=(), run_dir=None, actions=()) -> dict:
    """Runs the mode `overrides` name (`key=value` strings, as on the command line) into `run_dir` (None: a new
    folder under outputs/, as the command line makes one); `actions` (experiments/training/actions.py) are called after
    the run's own. Returns the final metrics: the last evaluation's, with `global_step`. Raises RunConfigError on a
    config error and RunFailed on another failure, each carrying the command line's line; an interrupt
    (KeyboardInterrupt) saves what the run did, as on the command line. The run directory's lock is let go of
    however it returns, so that another process (a command-line `mode=evaluate`) may use it at once."""
    from tf_harness.experiments import cli

    cli.setup()
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from tf_harness.experiments.run_dir import reentry

    args = list(overrides) + ([f"hydra.run.dir={run_dir}"] if run_dir is not None else [])
    with _process_state_kept():
        reentry.new_process_run()
        refused = cli.before_hydra(args)
        if refused:
            raise RunFailed(refused)
        try:
            outcome = cli.single_run(args, cli.train_and_evaluate, actions)
        except (HydraException, OmegaConfBaseException) as error:
            raise RunConfigError(cli.config_error_line(error)) from None
    if outcome.status == 2:
        raise RunConfigError(outcome.error)
    if outcome.status:
        raise RunFailed(outcome.error, outcome.status)
    return outcome.metrics


@contextlib.contextmanager
def _process_state_kept():
    """Gives the caller's process back as it was: the run takes the run directory's lock, installs its own SIGINT,
    SIGTERM and SIGUSR2 handlers and holds signals once it has logged its outcome (experiments/run_dir/
    interrupts.py), and Hydra points the root logger at the run's run.log. The run's input iterators, which reference
    cycles keep alive, are collected before it returns, so that nothing of the run outlives it; TensorFlow's
    iterators behind them end in data/iterators.py's thread."""
    from tf_harness.experiments.run_dir import interrupts, run_lock

    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR2)}
    root = logging.getLogger()
    kept = list(root.handlers), root.level
    try:
        yield
    finally:
        run_lock.release()
        interrupts.reset()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for handler in root.handlers:
            if handler not in kept[0]:
                handler.close()
        root.handlers[:], root.level = kept
        gc.collect()
