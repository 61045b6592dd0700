"""The review a user gets, seen in a real browser: a 2-value sweep, `tensorboard --logdir` on it, and headless
Chromium (Debian's `chromium`, driven by playwright) on the HParams, Time Series and Images dashboards."""
import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import run_cli

CHROMIUM = ("chromium", "/usr/bin/chromium")


def chromium():
    found = next((path for path in map(shutil.which, CHROMIUM) if path), None)
    if found is None:  # CI installs it (.ci/run): a missing browser is a failure, never a skip
        pytest.fail("Chromium not found: apt-get install -y chromium")
    return found


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_plugins(url, plugins, timeout=120):
    """Waits until TensorBoard has loaded the log dir far enough that `plugins` have data."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            listing = json.load(urllib.request.urlopen(f"{url}/data/plugins_listing", timeout=5))
            if all(listing.get(name, {}).get("enabled") for name in plugins):
                return
        except OSError:
            pass
        time.sleep(1)
    pytest.fail(f"TensorBoard at {url} did not show {plugins} within {timeout} s")


@pytest.fixture
def tensorboard(tmp_path):
    """Starts `tensorboard --logdir DIR --port FREE` for the test; yields a function that takes DIR."""
    started = []

    def start(logdir):
        port = free_port()
        log = open(tmp_path / "tensorboard.log", "w")
        command = [str(Path(sys.executable).with_name("tensorboard")), "--logdir", str(logdir), "--port", str(port),
                   "--host", "127.0.0.1"]
        started.append(subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT))
        return f"http://127.0.0.1:{port}"

    yield start
    for process in started:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.slow
def test_tensorboard_shows_the_sweep_its_input_wait_and_its_inputs_in_a_browser(tmp_path, tensorboard):
    from playwright.sync_api import expect, sync_playwright
    browser_path = chromium()
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "dataset=lfw_pairs", "experiment=smoke", "trainer.learning_rate=0.001,0.01",
                     f"hydra.sweep.dir={sweep}")
    assert result.returncode == 0, result.stderr[-3000:]
    url = tensorboard(sweep)
    wait_for_plugins(url, ["hparams", "timeseries", "images", "pr_curves"])
    shots = tmp_path / "screenshots"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 2100, "height": 640})
        # HParams: one row per run, the swept learning rates (printed with 5 digits) and the metric.
        page.goto(f"{url}/#hparams")
        table = page.locator("tf-hparams-table-view")
        for value in ("0.0010000", "0.010000"):
            expect(table.get_by_text(value, exact=True).first).to_be_visible(timeout=60_000)
        expect(table.get_by_text(str(sweep / "0"), exact=True)).to_be_visible()
        expect(table.get_by_text(str(sweep / "1"), exact=True)).to_be_visible()
        for column in ("trainer.learning_rate", "validation.accuracy", "validation.loss", "train.loss"):
            expect(table.get_by_role("columnheader", name=column, exact=True)).to_be_visible()
        page.screenshot(path=shots / "hparams.png")
        # Time Series: the input-bound fraction's card.
        page.goto(f"{url}/#timeseries")
        expect(page.get_by_text("input_wait_fraction", exact=True).first).to_be_visible(timeout=60_000)
        page.screenshot(path=shots / "timeseries.png")
        # Images: the training inputs, as the model sees them.
        page.goto(f"{url}/#images")
        images = page.locator("tf-image-dashboard")
        expect(images.get_by_text("inputs", exact=True).first).to_be_visible(timeout=60_000)
        expect(images.locator("tf-image-loader img").first).to_be_visible(timeout=60_000)
        page.screenshot(path=shots / "images.png")
        browser.close()
    assert all((shots / name).stat().st_size > 10_000 for name in ("hparams.png", "timeseries.png", "images.png"))
