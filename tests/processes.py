"""A pytest plugin that counts the processes a test run starts: `python -m pytest -p tests.processes`.

At the end it prints how many processes the tests started, as `python run.py` (or `tf-harness`), as another
Python, and as any other program, with the wall and CPU seconds each kind took, and the tests that started the
most. docs/benchmarks.md quotes it for the fast suite. Only the pytest process's own starts are counted (a
process's children are its own business); the counting begins when pytest configures the plugin.
"""
import os
import resource
import subprocess
import sys
import time
from collections import Counter, defaultdict

_started = []  # {"test", "kind", "wall", "cpu"} per process
_current = {"test": None}


def _kind(args) -> str:
    argv = [str(part) for part in (args if isinstance(args, (list, tuple)) else [args])]
    text = " ".join(argv)
    if "run.py" in text or "tf-harness" in text:
        return "run.py"
    if argv and (argv[0] == sys.executable or os.path.basename(argv[0]).startswith("python")):
        return "other Python"
    return "other program"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def pytest_configure(config):
    original_init, original_wait = subprocess.Popen.__init__, subprocess.Popen.wait

    def init(self, args, *rest, **kwargs):
        self._counted = {"test": _current["test"], "kind": _kind(args), "start": time.monotonic()}
        _started.append(self._counted)
        return original_init(self, args, *rest, **kwargs)

    def wait(self, *rest, **kwargs):
        before = _children_cpu()
        returned = original_wait(self, *rest, **kwargs)
        counted = getattr(self, "_counted", None)
        if counted is not None and "wall" not in counted:
            counted["wall"], counted["cpu"] = time.monotonic() - counted["start"], _children_cpu() - before
        return returned

    def restore():
        subprocess.Popen.__init__, subprocess.Popen.wait = original_init, original_wait

    subprocess.Popen.__init__, subprocess.Popen.wait = init, wait
    config.add_cleanup(restore)


def pytest_runtest_setup(item):
    _current["test"] = item.nodeid


def pytest_terminal_summary(terminalreporter):
    kinds, wall, cpu = Counter(), defaultdict(float), defaultdict(float)
    for counted in _started:
        kinds[counted["kind"]] += 1
        wall[counted["kind"]] += counted.get("wall", 0.0)
        cpu[counted["kind"]] += counted.get("cpu", 0.0)
    terminalreporter.write_sep("=", f"processes started: {len(_started)}")
    for kind, count in kinds.most_common():
        terminalreporter.write_line(f"{count:5d} {kind:<14} {wall[kind]:8.1f} s wall {cpu[kind]:8.1f} s CPU")
    by_test = Counter(counted["test"] for counted in _started)
    for test, count in by_test.most_common(10):
        terminalreporter.write_line(f"{count:5d}  {test}")
