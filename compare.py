"""`python -m tf_harness.compare RUN_A RUN_B [--split test]`: compares two runs' predictions on the same examples
(experiments/compare.py)."""
import sys

from tf_harness.experiments import cli, startup

cli.setup()  # as in run.py
startup.import_tensorflow_quietly()  # where a module it reads imports TensorFlow: its start-up lines kept out

from tf_harness.experiments.compare import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
