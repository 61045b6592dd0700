"""The dashboard users open over a stored study: a real Optuna sweep's optuna.db, `optuna-dashboard` on a loopback
port (the command docs/sweeps-and-review.md gives), and headless Chromium showing each trial, its value, its
parameters and its run directory."""
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.test_tensorboard_review import chromium, free_port


def wait_for(url, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:
                return answer.read()
        except OSError:
            time.sleep(0.5)
    pytest.fail(f"optuna-dashboard did not answer at {url} within {timeout} s")


@pytest.mark.slow
def test_optuna_dashboard_shows_a_sweeps_trials_and_their_values_in_a_browser(tmp_path):
    import optuna
    from playwright.sync_api import expect, sync_playwright
    browser_path = chromium()
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "hparams_search=optuna", "dataset=lfw_pairs", "experiment=smoke", "hydra.sweeper.n_trials=2",
                     f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    trials = optuna.load_study(study_name="lfw_pairs", storage=f"sqlite:///{sweep}/optuna.db").trials
    port = free_port()
    with open(tmp_path / "dashboard.log", "w") as log:
        dashboard = subprocess.Popen([str(Path(sys.executable).with_name("optuna-dashboard")),
                                      f"sqlite:///{sweep}/optuna.db", "--host", "127.0.0.1", "--port", str(port)],
                                     stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        assert b'"study_name": "lfw_pairs"' in wait_for(f"{url}/api/studies")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.goto(f"{url}/dashboard/studies/1/trials")
            expect(page.get_by_text("2 Trials")).to_be_visible(timeout=30_000)
            for trial in trials:
                page.get_by_text(f"Trial {trial.number}", exact=True).first.click()
                heading = page.get_by_role("heading", name=f"Trial {trial.number} (trial_id=")
                expect(heading).to_be_visible(timeout=30_000)
                body = page.inner_text("body")
                assert repr(trial.value) in body and f"run_dir {sweep / str(trial.number)}" in body, body[:2000]
                for name, value in trial.params.items():
                    assert f"{name} {value}" in body, body[:2000]
            page.screenshot(path=tmp_path / "dashboard.png")
            browser.close()
    finally:
        dashboard.terminate()
        dashboard.wait(timeout=30)
