"""tests/refusals.py fails a refusal that has the wrong exit status or exception type, more than its one line, a
traceback, or a line that does not name what it must."""
import subprocess

import pytest

from tests.refusals import assert_config_error, assert_error, raises_naming


def _finished(status, stderr):
    return subprocess.CompletedProcess(["run.py"], status, stdout="", stderr=stderr)


def test_a_config_error_is_exit_2_and_its_one_line_naming_each_name():
    line = "config error: trainer.eval_steps=-3 is not an integer >= 1\n"
    assert assert_config_error(_finished(2, line), "trainer.eval_steps=-3", ">= 1") == line.strip()
    for wrong in (_finished(1, line), _finished(2, "a warning\n" + line), _finished(2, line + line),
                  _finished(2, "Traceback (most recent call last):\n" + line), _finished(2, line + "a warning\n"),
                  _finished(2, "error: " + line)):
        with pytest.raises(AssertionError):
            assert_config_error(wrong, "trainer.eval_steps=-3")
    with pytest.raises(AssertionError, match="does not name"):
        assert_config_error(_finished(2, line), "trainer.eval_every")
    assert assert_config_error(_finished(2, "a warning\n" + line), "trainer.eval_steps", alone=False)


def test_an_error_is_its_exit_status_and_one_closing_error_line():
    stderr = "a log line\nerror: No space left on device: /run/checkpoints; free some space\n"
    assert assert_error(_finished(1, stderr), 1, "/run/checkpoints").startswith("error: No space")
    for wrong in (_finished(2, stderr), _finished(1, stderr + "more\n"), _finished(1, stderr + stderr)):
        with pytest.raises(AssertionError):
            assert_error(wrong, 1, "/run/checkpoints")
    with pytest.raises(AssertionError):
        assert_error(_finished(1, stderr), 1, "/run/checkpoints", alone=True)
    with pytest.raises(AssertionError, match="does not name"):
        assert_error(_finished(1, stderr), 1, "/run/metrics.json")


def test_an_exception_is_its_type_and_a_message_naming_each_name():
    with raises_naming(ValueError, "pipeline.image_size=48", "32") as caught:
        raise ValueError("pipeline.image_size=48, but the shards hold 32-pixel images")
    assert caught.type is ValueError
    with pytest.raises(AssertionError, match="does not name"):
        with raises_naming(ValueError, "pipeline.image_size=64"):
            raise ValueError("pipeline.image_size=48, but the shards hold 32-pixel images")
    with pytest.raises(KeyError):
        with raises_naming(ValueError, "pipeline.image_size=48"):
            raise KeyError("pipeline.image_size=48")
    with pytest.raises(pytest.fail.Exception):
        with raises_naming(ValueError, "pipeline.image_size=48"):
            pass
