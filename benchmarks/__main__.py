"""`python -m benchmarks` lists the benchmarks; `python -m benchmarks NAME [options]` runs one."""
import ast
import importlib
import os
import sys
from pathlib import Path

# Every benchmark, in the order listed. Each is benchmarks/NAME.py with a `main(argv)`; the first line of its
# docstring is its description.
BENCHMARKS = ("steps", "input", "compile_cache", "service", "real_size", "faults")


def description(name):
    """The first line of a benchmark's docstring, read without importing it (nor TensorFlow)."""
    tree = ast.parse((Path(__file__).parent / f"{name}.py").read_text(encoding="utf-8"))
    return ast.get_docstring(tree).splitlines()[0]


def listing():
    width = max(map(len, BENCHMARKS))
    return "\n".join(f"  {name:<{width}}  {description(name)}" for name in BENCHMARKS)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: python -m benchmarks NAME [options]   (python -m benchmarks NAME --help: its options)\n\n"
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
