"""Exit statuses of the command line: 0 success, 2 bad config or usage, 1 anything else."""
import os
import sys
import uuid

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from hydra.errors import HydraException

from data.errors import ConfigError, DatasetError
from experiments.trainer import NonFiniteLossError

# Hydra prints composition errors itself, over several lines, then exits 1. Asking
# it to raise instead lets this module print one line and exit 2.
os.environ.setdefault("HYDRA_FULL_ERROR", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# A short random id in run directory names keeps runs started in the same second apart.
OmegaConf.register_new_resolver("run_id", lambda: uuid.uuid4().hex[:6], use_cache=True)


def _one_line(error) -> str:
    parts = [str(error)]
    if error.__cause__ is not None and str(error.__cause__) not in parts[0]:
        parts.append(str(error.__cause__))
    lines = [line.strip() for part in parts for line in part.splitlines() if line.strip()]
    # OmegaConf appends 'full_key: ...' / 'object_type=...' detail lines; the key is already named.
    lines = [line for line in lines if not line.startswith(("full_key:", "object_type=", "reference_type="))]
    return " ".join(lines)


def exit_code(main) -> int:
    """Runs a Hydra main function and maps its outcome to the documented exit status."""
    try:
        main()
    except (ConfigError, HydraException, OmegaConfBaseException) as error:
        print(f"config error: {_one_line(error)}", file=sys.stderr)
        return 2
    except (DatasetError, NonFiniteLossError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 0
