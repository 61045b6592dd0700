"""Every process answers SIGTERM and SIGINT within seconds, whatever it waits on. The trainer waiting on input
and a tf.data service worker whose dispatcher was killed are in tests/test_service.py and tests/test_stuck_input.py;
a file it would wait on for ever is refused before it is opened (tests/test_reading.py). Here: the sidecar
evaluator waiting for the trainer's next checkpoint, and the comparison of two runs amid its bootstrap."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import PROJECT, run_cli

TINY = ("dataset=lfw_pairs", "experiment=smoke", "pipeline.image_size=24", "pipeline.batch_size=8",
        "model.widths=[8,16]", "model.embedding_size=16", "model.head_units=8", "trainer.eval_steps=1")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("signals") / "run"
    result = run_cli(*TINY, "trainer.train_steps=2", "trainer.checkpoint_every=2", f"hydra.run.dir={run_dir}",
                     timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


@pytest.mark.slow  # a training run, then the sidecar starts TensorFlow and evaluates once before it waits
@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_the_sidecar_waiting_for_a_new_checkpoint_stops_at_a_signal(trained, tmp_path, signum, status):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    (run_dir / "metrics.json").unlink()  # so it evaluates ckpt-2 first, then waits for ckpt-4, which never comes
    process = subprocess.Popen([sys.executable, "run.py", f"hydra.run.dir={run_dir}", "mode=continuous_eval",
                                "trainer.train_steps=4"], cwd=PROJECT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        deadline = time.monotonic() + 300
        while True:  # metrics.json of step 2 written: it has evaluated, and polls for the next checkpoint
            try:
                if json.loads((run_dir / "metrics.json").read_text()).get("global_step") == 2:
                    break
            except (OSError, ValueError):
                pass
            assert process.poll() is None and time.monotonic() < deadline, process.stderr.read()[-3000:]
            time.sleep(0.2)
        time.sleep(3)  # well into the wait
        assert process.poll() is None
        sent = time.monotonic()
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        process.kill()
    assert process.returncode == status, stderr[-3000:]
    assert took < 15, took  # the handler's line at once; TensorFlow's own exit takes seconds on 2 busy cores
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == f"interrupted by {signal.Signals(signum).name}", stderr[-2000:]


def test_compare_stopped_by_ctrl_c_amid_its_bootstrap_is_one_line_and_130(tmp_path, monkeypatch, capsys):
    from tf_harness.experiments import compare
    from tf_harness.experiments.evaluation import intervals

    for name in ("a", "b"):
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "config.yaml").write_text("dataset:\n  name: lfw_pairs\n")
        rows = "".join(f"a{k},b{k},{k % 2},0.{k},3,test\n" for k in range(6))
        (tmp_path / name / "predictions.csv").write_text("path_a,path_b,label,score,global_step,split\n" + rows)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(intervals, "paired", interrupted)
    assert compare.main([str(tmp_path / "a"), str(tmp_path / "b")]) == 130
    printed = capsys.readouterr().err
    assert printed.count("\n") == 1 and "interrupted by SIGINT" in printed, printed
