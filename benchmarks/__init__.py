"""The project's benchmarks, run from the repository root through one entry point:

    python -m benchmarks                      # lists them, one line each
    python -m benchmarks NAME [options]       # runs one
    python -m benchmarks NAME --help          # its options

A benchmark is a module here with a `main(argv)` (named in `benchmarks.__main__.BENCHMARKS`); the other
modules are what they share and never run on their own: `measure` (timing, paired rounds, CPU seconds,
load average, the figures' format), `record` (a run's header and footer, and the results file every run
writes under benchmarks/results/), `data_api` (the only contact with the project's data API), the
independent baselines (`input_baselines`, `step_baselines`) that the project's code is measured against,
and the parts of a benchmark too long for one module (`step_modes`, `first_calls`, `input_report`, ...).
"""
