"""What a test checks of a refusal: the exit status or exception type, the one line, and the keys, values and paths
that line names.

The words around those names are free to change. A test pins a whole sentence only where the sentence itself is
the contract: the docs' tables that tests/test_damage_matrix.py compares with what runs do, and the lines the docs
quote, such as run.log's closing line.
"""
from contextlib import contextmanager

import pytest


def assert_names(message, *named):
    """Checks that `message` names each of `named` (a key, a value, a path, an allowed choice); returns it."""
    assert isinstance(message, str), f"no message: {message!r}"
    missing = [str(name) for name in named if str(name) not in message]
    assert not missing, f"{message!r} does not name {missing}"
    return message


def refusal_line(result, status, prefix, *named, alone=True):
    """The line starting with `prefix` that the finished process `result` (a CompletedProcess) printed on stderr.

    Checks the exit status `status`, that no traceback was printed, that exactly one line starts with `prefix` and
    that it is the last line (the only line, when `alone`), and that it names each of `named`.
    """
    stderr = result.stderr or ""
    assert result.returncode == status, f"exit status {result.returncode}, not {status}; stderr:\n{stderr[-3000:]}"
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.strip().splitlines()
    refusals = [line for line in lines if line.startswith(prefix)]
    assert len(refusals) == 1 and lines[-1] == refusals[0], f"not one closing `{prefix}` line:\n{stderr[-3000:]}"
    assert not alone or len(lines) == 1, f"more than the one `{prefix}` line on stderr:\n{stderr[-3000:]}"
    return assert_names(refusals[0], *named)


def assert_config_error(result, *named, alone=True):
    """A config error: exit status 2 and one `config error: ` line on stderr naming each of `named`; returns it.
    `alone=False` lets lines printed before the refusal stand (a refusal found once TensorFlow has started)."""
    return refusal_line(result, 2, "config error: ", *named, alone=alone)


def assert_error(result, status, *named, alone=False):
    """A failure: exit status `status` and one closing `error: ` line on stderr naming each of `named`; returns it.
    `alone=True` also checks that nothing else was printed on stderr."""
    return refusal_line(result, status, "error: ", *named, alone=alone)


@contextmanager
def raises_naming(error_type, *named):
    """`pytest.raises(error_type)` whose message names each of `named`; yields pytest's ExceptionInfo."""
    with pytest.raises(error_type) as caught:
        yield caught
    assert_names(str(caught.value), *named)


def one_naming(lines, *named):
    """The one line of `lines` (log messages, say) that names each of `named`; fails when none or several do."""
    lines = list(lines)
    naming = [line for line in lines if all(str(name) in line for name in named)]
    assert len(naming) == 1, f"{len(naming)} lines name {[str(name) for name in named]}: {lines}"
    return naming[0]
