"""`python -m benchmarks` lists the benchmarks; `python -m benchmarks NAME [options]` runs one."""
import importlib
import os
import sys

# Every benchmark, in the order listed. Each is benchmarks/NAME.py with a `main(argv)`; the first line of its
# docstring is its description. Importing one starts no TensorFlow: each imports it where it builds its rows.
BENCHMARKS = ("steps", "input", "compile_cache", "service", "real_size", "faults", "intervals", "heatmaps")


def description(name):
    """The first line of a benchmark's docstring."""
    return importlib.import_module(f"benchmarks.{name}").__doc__.splitlines()[0]


def listing():
    width = max(map(len, BENCHMARKS))
    return "\n".join(f"  {name:<{width}}  {description(name)}" for name in BENCHMARKS)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m benchmarks NAME [options]   (python -m benchmarks NAME --help: its options)\n"
              "Each run prints its tables and writes them, with the machine, date and command, to\n"
              "benchmarks/results/<date>-<time>-NAME.json (or under $HARNESS_BENCHMARK_RESULTS).\n\n"
              f"benchmarks:\n{listing()}")
        return 0
    if argv[0] not in BENCHMARKS:
        print(f"no benchmark named {argv[0]!r}; choose one of:\n{listing()}", file=sys.stderr)
        return 2
    # Before TensorFlow starts: its C++ start-up lines would bury the tables.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    module = importlib.import_module(f"benchmarks.{argv[0]}")
    return module.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
