"""Exit statuses of the command line: 0 success, 2 bad config or usage, 130/143 interrupted by
SIGINT/SIGTERM, 1 anything else.

Nothing here imports TensorFlow: a config is checked against experiments/schema.py first, so a bad
one is reported in about a second, before TensorFlow's start-up messages.
"""
import logging
import os
import sys
import uuid

# Before TensorFlow is imported: keep its C++ start-up chatter out of the user's terminal.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Hydra prints composition errors itself, over several lines, then exits 1. Asking
# it to raise instead lets this module print one line and exit 2.
os.environ.setdefault("HYDRA_FULL_ERROR", "1")

from hydra.errors import HydraException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from omegaconf.errors import OmegaConfBaseException  # noqa: E402

from experiments import interrupts, run_directory, schema  # noqa: E402

logging.getLogger("tensorflow").setLevel(logging.WARNING)
# A short random id in run directory names keeps runs started in the same second apart.
OmegaConf.register_new_resolver("run_id", lambda: uuid.uuid4().hex[:6], use_cache=True)
# hydra.output_subdir: .hydra for a new run, .hydra/reentry-<time> when re-entering a recorded one.
OmegaConf.register_new_resolver("run_dir_subdir", run_directory.subdir)


def _one_line(error) -> str:
    parts = [str(error)]
    if error.__cause__ is not None and str(error.__cause__) not in parts[0]:
        parts.append(str(error.__cause__))
    lines = [line.strip() for part in parts for line in part.splitlines() if line.strip()]
    # OmegaConf appends 'full_key: ...' / 'object_type=...' detail lines; the key is already named.
    lines = [line for line in lines if not line.startswith(("full_key:", "object_type=", "reference_type="))]
    if any(line.startswith("Config search path") for line in lines):
        lines = lines[:next(i for i, line in enumerate(lines) if line.startswith("Config search path"))]
    return " ".join(lines)


def _report(error, prefix) -> None:
    print(f"{prefix}: {_one_line(error)}", file=sys.stderr)


_status = 0


def guarded(task, cfg) -> None:
    """Checks `cfg` against the schema, then runs one job, turning expected failures into a
    one-line message and an exit status.

    Errors are handled inside the job rather than raised through Hydra, which
    would add its own lines, and so that one failed job of a sweep does not stop
    the others. `task` should import TensorFlow itself, so that it starts only
    once the config has passed.
    """
    global _status
    # Re-entering a recorded run directory runs its saved config, changed only in run-control keys.
    cfg, problem = run_directory.effective(cfg)
    problem = problem or schema.first_problem(cfg, os.environ)
    if problem:
        print(f"config error: {problem}", file=sys.stderr)
        _status = max(_status, 2)
        return
    # The data package and the trainer import TensorFlow; the config has passed by now.
    from data.errors import ConfigError, DatasetError
    from experiments.trainer import NonFiniteLossError

    try:
        task(cfg)
    except ConfigError as error:
        _report(error, "config error")
        _status = max(_status, 2)
    except (DatasetError, NonFiniteLossError) as error:
        _report(error, "error")
        _status = max(_status, 1)


def exit_code(main) -> int:
    """Runs a Hydra main function and returns the documented exit status."""
    # Re-entering a recorded run directory composes its own dataset, model and experiment.
    sys.argv[1:] = run_directory.with_saved_choices(sys.argv[1:])
    try:
        main()
    except (HydraException, OmegaConfBaseException) as error:
        _report(error, "config error")
        return 2
    except KeyboardInterrupt as error:  # Ctrl-C, or SIGINT/SIGTERM as experiments.interrupts.Interrupted
        print(f"interrupted{f' by {error}' if str(error) else ''}", file=sys.stderr)
        return interrupts.exit_status(error)  # 130 for SIGINT, 143 for SIGTERM
    return _status
