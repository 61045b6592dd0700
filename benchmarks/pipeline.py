#!/usr/bin/env python
"""The input benchmarks under their former name: dispatches to benchmarks/throughput.py, or, with
`--starvation`, to benchmarks/starvation.py (every other flag passes through unchanged).

    python benchmarks/pipeline.py [throughput flags]      # = python benchmarks/throughput.py ...
    python benchmarks/pipeline.py --starvation [flags]    # = python benchmarks/starvation.py ...
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--starvation" in argv:
        import starvation

        argv.remove("--starvation")
        return starvation.main(argv, program="benchmarks/pipeline.py --starvation")
    import throughput

    return throughput.main(argv, program="benchmarks/pipeline.py")


if __name__ == "__main__":
    sys.exit(main())
