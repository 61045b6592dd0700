"""The review a user gets, seen in a real browser: a 3-value sweep, one of its jobs failing, in the default sweep
folder layout, `tensorboard --logdir` on it, and headless Chromium (Debian's `chromium`, driven by playwright) on the
HParams, Time Series and Images dashboards."""
import json
import re
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
    if found is None:  # a missing browser is a failure, never a skip
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


# The HParams dashboard's parts (TensorBoard 2.21's Polymer elements, reached through their shadow roots).
TABLE, PLOT = "tf-hparams-table-view", "tf-hparams-parallel-coords-plot"
# The width of a cell's first `chars` characters, and the cell's: the Trial ID column is 10em, cut with an ellipsis.
SHOWN = """(cell, chars) => { const range = document.createRange(); const text = cell.firstChild;
  range.setStart(text, 0); range.setEnd(text, Math.min(chars, text.length));
  return [range.getBoundingClientRect().width, cell.clientWidth]; }"""


def shown_cell(table, text):
    """The table's visible cell that reads `text` (vaadin-grid keeps rows it hides after a filter)."""
    return table.locator("div.table-cell:visible").filter(has_text=re.compile(f"^{re.escape(text)}$"))


def cell_text(table, trial_id, column):
    """The text the table shows in `column` of the row whose Trial ID is `trial_id`. vaadin-grid lays the cells out
    flat: the headers (up to the first empty cell), then each row's, which have none for `Show Metrics`."""
    cells = [text.strip() for text in table.locator("div.table-cell").all_inner_texts()]
    headers = cells[:cells.index("")]
    row = cells[cells.index(trial_id):][:len(headers) - 1]
    return row[headers.index(column) - 1]


@pytest.mark.slow
def test_tensorboard_shows_the_sweep_its_input_wait_and_its_inputs_in_a_browser(tmp_path, tensorboard):
    from playwright.sync_api import expect, sync_playwright
    browser_path = chromium()
    # The default layout, outputs/multirun/<date>/<time>_<id>/<job>, and `tensorboard --logdir` above it.
    logdir = tmp_path / "multirun"
    # lr=1e30 makes step 2's loss non-finite, and max_nonfinite_steps=1 stops that job there, before its
    # first evaluation, whatever the weights evaluate to (that depends on the graph optimizer's passes).
    result = run_cli("-m", "dataset=lfw_pairs", "experiment=smoke", "trainer.learning_rate=0.001,0.01,1e30",
                     "trainer.max_nonfinite_steps=1",
                     f"hydra.sweep.dir={logdir}/${{now:%Y-%m-%d}}/${{now:%H-%M-%S}}_${{run_id:}}")
    assert result.returncode == 1, result.stderr[-3000:]  # 1e30: a non-finite loss
    (sweep,) = logdir.glob("*/*")
    summary = result.stderr.rstrip().splitlines()[-1]
    assert summary.startswith("3 jobs ran, 1 failed; best accuracy ") and summary.endswith(
        (f"(trainer.learning_rate=0.001): {sweep / '0'}", f"(trainer.learning_rate=0.01): {sweep / '1'}")), summary
    url = tensorboard(logdir)
    wait_for_plugins(url, ["hparams", "timeseries", "images", "pr_curves"])
    shots = tmp_path / "screenshots"
    trial_ids = [f"{job} · {sweep.name}" for job in range(3)]
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 2100, "height": 640})
        # HParams: one row per run, the swept learning rates (printed with 5 digits) and the metrics.
        page.goto(f"{url}/#hparams")
        table = page.locator(TABLE)
        for value in ("0.0010000", "0.010000", "1.0000e+30"):
            expect(table.get_by_text(value, exact=True).first).to_be_visible(timeout=60_000)
        # Each Trial ID is short: the job number and the sweep's time show in the 10em column.
        for trial_id in trial_ids:
            cell = shown_cell(table, trial_id)
            expect(cell).to_be_visible()
            shown, width = cell.evaluate(SHOWN, len(trial_id.split("_")[0]))
            assert shown + 16 <= width, (trial_id, shown, width)  # and room for the ellipsis
        # Only the metrics an LFW run writes, and the exit status: the failed job's is 1.
        columns = ("trainer.learning_rate", "validation.accuracy", "validation.loss", "train.loss", "exit_status")
        for column in columns:
            expect(table.get_by_role("columnheader", name=column, exact=True)).to_be_visible()
        for absent in ("validation.auc/mean", "validation.top5_accuracy"):
            expect(table.get_by_role("columnheader", name=absent)).to_have_count(0)
        statuses = {trial_id: cell_text(table, trial_id, "exit_status") for trial_id in trial_ids}
        assert statuses == {trial_ids[0]: "0.0000", trial_ids[1]: "0.0000", trial_ids[2]: "1.0000"}, statuses
        page.screenshot(path=shots / "hparams.png")
        # The session status: with Success unticked, the failed job's row alone is left.
        page.locator("tf-hparams-query-pane").get_by_role("checkbox", name="Success").click()
        for trial_id, count in zip(trial_ids, (0, 0, 1)):
            expect(shown_cell(table, trial_id)).to_have_count(count, timeout=30_000)
        page.locator("tf-hparams-query-pane").get_by_role("checkbox", name="Success").click()
        expect(shown_cell(table, trial_ids[0])).to_be_visible(timeout=30_000)
        # Parallel coordinates: a line per run with a value in every metric column, as ticked by default; the
        # failed job stopped before its first evaluation, so it has no validation metrics and no line.
        page.get_by_text("Parallel Coordinates View").click()
        expect(page.locator(f"{PLOT} g.foreground path")).to_have_count(2, timeout=60_000)
        page.screenshot(path=shots / "parallel_coordinates.png")
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
    names = ("hparams.png", "parallel_coordinates.png", "timeseries.png", "images.png")
    assert all((shots / name).stat().st_size > 10_000 for name in names)
