"""pipeline.service: training input made by a tf.data service's workers (data/service.py)."""
import json
import os
import logging
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import PROJECT, compose, run_cli
from tests.refusals import assert_config_error, assert_error, assert_names, raises_naming

SMALL_RUN = ("dataset=imagenet_det", "experiment=smoke", "trainer.eval_every=100")


def _free_port():
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


class Server:
    """`python -m tf_harness.data.service ...` as a user starts it, its log in a file."""

    def __init__(self, log_path, *args):
        self.log_path = log_path
        self.log = open(log_path, "w")
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
        self.process = subprocess.Popen([sys.executable, "-m", "tf_harness.data.service", *args], cwd=PROJECT, env=env,
                                        stdout=self.log, stderr=subprocess.STDOUT)

    def wait_for(self, text, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self.log_path.read_text():
                return
            assert self.process.poll() is None, self.log_path.read_text()
            time.sleep(0.2)
        pytest.fail(f"no {text!r} in {self.log_path.read_text()}")

    def stop(self):
        """SIGTERM; returns the exit status."""
        self.process.send_signal(signal.SIGTERM)
        status = self.process.wait(timeout=60)
        self.log.close()
        return status


@pytest.fixture
def service(tmp_path):
    """A dispatcher and two workers on localhost; yields the dispatcher's address. Each must stop cleanly."""
    port = _free_port()
    address = f"grpc://localhost:{port}"
    dispatcher = Server(tmp_path / "dispatcher.log", "dispatcher", "--port", str(port), "--host", "localhost")
    dispatcher.wait_for("Dispatcher listening")
    workers = [Server(tmp_path / f"worker{index}.log", "worker", "--dispatcher", address, "--host", "localhost")
               for index in range(2)]
    for worker in workers:
        worker.wait_for("Worker started")
    yield address
    for server in (*workers, dispatcher):
        assert server.stop() == 0, server.log_path.read_text()
        assert "stopped" in server.log_path.read_text()


# ----- the config: checked before TensorFlow starts ---------------------------------------------------------


@pytest.mark.parametrize("value", ["localhost:5050", "grpc://localhost", "grpc://localhost:0", "grpc://h:70000",
                                   "http://localhost:5050", 5050])
def test_a_malformed_service_address_is_one_line(value):
    from tf_harness.experiments.config import schema

    problem = schema.first_problem(compose("dataset=chest_xray", f"pipeline.service={value}"), {})
    assert_names(problem, f"pipeline.service={value}", "grpc://host:port", "1..65535", "null")


@pytest.mark.parametrize("value", ["grpc://localhost:5050", "grpc://node-7.cluster.example:1", "grpc://10.0.0.2:65535",
                                   "'grpc://[::1]:5050'", "null"])
def test_a_good_service_address_passes(value):
    from tf_harness.experiments.config import schema

    assert schema.problems(compose("dataset=chest_xray", f"pipeline.service={value}"), {}) == []


def test_the_service_does_not_go_with_a_cache():
    from tf_harness.experiments.config import schema

    cfg = compose("dataset=chest_xray", "pipeline.service=grpc://localhost:5050", "pipeline.cache=memory")
    assert_names(schema.first_problem(cfg, {}), "pipeline.cache=memory", "pipeline.service=grpc://localhost:5050")


def test_the_schema_checks_the_address_as_the_service_does():
    from tf_harness.data import service
    from tf_harness.experiments.config import schema

    assert schema.SERVICE_ADDRESS.pattern == service.ADDRESS.pattern


def test_run_py_reports_a_malformed_address_in_one_line_before_tensorflow_starts(tmp_path):
    result = subprocess.run([sys.executable, "run.py", "dataset=chest_xray", "pipeline.service=localhost:5050",
                             f"hydra.run.dir={tmp_path}"], cwd=PROJECT, capture_output=True, text=True, timeout=60)
    assert_config_error(result, "pipeline.service=localhost:5050", "grpc://host:port", "null")
    assert result.stdout == ""


def test_a_worker_says_in_one_line_when_its_dispatcher_cannot_be_reached(tmp_path):
    port = _free_port()  # nothing listens there
    command = [sys.executable, "-m", "tf_harness.data.service", "worker", "--dispatcher", f"grpc://localhost:{port}"]
    result = subprocess.run(command, cwd=PROJECT, capture_output=True, text=True, timeout=120,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    # TensorFlow's start-up lines come first: the data package imports it before the command line runs.
    assert_config_error(result, f"--dispatcher=grpc://localhost:{port}", "Connection refused",
                        f"`python -m tf_harness.data.service dispatcher --port {port}`", alone=False)


# ----- the pipeline through an in-process service -------------------------------------------------------------


def test_the_service_serves_the_training_batches_the_local_pipeline_makes(monkeypatch):
    import numpy as np
    import tensorflow as tf
    from tensorflow.data.experimental import service as tf_service

    from tests.conftest import make_input, tables_of

    # distributed_epoch: a record goes to one worker, so the epoch is not served once per worker. Which records
    # the two workers serve first depends on their timing, so the mode is read where the pipeline asks for it.
    policies, distribute = [], tf_service.distribute

    def recorded(policy, *args, **kwargs):
        policies.append(policy)
        return distribute(policy, *args, **kwargs)

    monkeypatch.setattr(tf_service, "distribute", recorded)
    dispatcher = tf_service.DispatchServer(tf_service.DispatcherConfig(port=0))
    workers = [tf_service.WorkerServer(tf_service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
               for _ in range(2)]
    cfg = compose("dataset=imagenet_det", "pipeline.image_size=32", "pipeline.batch_size=4")
    table = tables_of(cfg)["train"]
    local = make_input(cfg, table, True, "train")
    cfg.pipeline.service = dispatcher.target
    served = make_input(cfg, table, True, "train")
    assert policies == [tf_service.ShardingPolicy.DYNAMIC]
    assert served.element_spec == local.element_spec
    # Every training image, decoded here in table order; the service's first epoch's worth are all among them.
    known = {image.tobytes() for features, _, weights in make_input(cfg, table, False, "train")
             for image, weight in zip(features.numpy(), weights.numpy()) if weight}
    epoch = len(table) // 4
    batches = list(served.take(epoch).as_numpy_iterator())
    images = [image.tobytes() for features, _, _ in batches for image in features]
    assert len(images) == 4 * epoch and set(images) <= known
    assert all(np.array_equal(weights, np.ones(4)) for _, _, weights in batches)
    del workers, dispatcher, tf


# ----- end to end ------------------------------------------------------------------------------------------------


@pytest.mark.slow  # a dispatcher, two workers and two runs start TensorFlow: about a minute on 2 cores
def test_a_service_fed_run_trains_to_the_end_and_resumes(service, tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli(*SMALL_RUN, f"pipeline.service={service}", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Training input from the tf.data service at {service}" in result.stdout
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["global_step"] == 4
    # Checkpoints leave the iterator out, and say so for the next resume.
    records = json.loads((run_dir / "checkpoints" / "input_pipelines.json").read_text())
    assert records[-1]["input"] is None
    result = run_cli(*SMALL_RUN, f"pipeline.service={service}", "trainer.train_steps=6", f"hydra.run.dir={run_dir}")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "at global step 4" in result.stdout
    assert "The checkpoint holds no input iterator: the input stream starts over at global step 4" in result.stdout
    assert json.loads((run_dir / "metrics.json").read_text())["global_step"] == 6


@pytest.mark.slow  # starts TensorFlow and indexes the sample before it reaches the service
def test_a_run_whose_dispatcher_cannot_be_reached_exits_2_in_one_line(tmp_path):
    port = _free_port()
    result = run_cli(*SMALL_RUN, f"pipeline.service=grpc://localhost:{port}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_config_error(result, f"pipeline.service=grpc://localhost:{port}", "Connection refused",
                        f"`python -m tf_harness.data.service dispatcher --port {port}`", alone=False)


@pytest.fixture
def workerless_dispatcher():
    """A dispatcher in this process with no worker: it accepts a trainer and never serves it a batch. Yields its
    address."""
    from tensorflow.data.experimental import service as tf_service

    dispatcher = tf_service.DispatchServer(tf_service.DispatcherConfig(port=0))
    yield dispatcher.target
    dispatcher.stop()


def _waiting_line(address):
    return (f"waiting for the first training batch for 30 s (pipeline.service={address}: is a worker running? start "
            f"one with `python -m tf_harness.data.service worker --dispatcher {address}`; the run fails after "
            f"pipeline.service_timeout=300 s)")


@pytest.mark.slow  # TensorFlow starts, then the run waits 30 s for its first waiting line
@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_run_waiting_on_a_dispatcher_without_a_worker_says_so_and_stops_at_a_signal(workerless_dispatcher, tmp_path,
                                                                                      signum, status):
    address, output = workerless_dispatcher, tmp_path / "stdout"
    with open(output, "w") as stdout:
        process = subprocess.Popen([sys.executable, "run.py", *SMALL_RUN, f"pipeline.service={address}",
                                    f"hydra.run.dir={tmp_path / 'run'}"], cwd=PROJECT, stdout=stdout,
                                   stderr=subprocess.PIPE, text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
        try:
            deadline = time.monotonic() + 300
            while "waiting for the first training batch" not in output.read_text() and time.monotonic() < deadline:
                assert process.poll() is None, process.stderr.read()[-3000:]
                time.sleep(0.2)
            sent = time.monotonic()
            process.send_signal(signum)
            _, stderr = process.communicate(timeout=120)
            took = time.monotonic() - sent
        finally:
            process.kill()
    assert any(line.endswith(f"[WARNING] - {_waiting_line(address)}") for line in output.read_text().splitlines())
    assert process.returncode == status, stderr[-3000:]
    assert took < 15, took  # the handler's line at once; TensorFlow's own exit takes a few seconds on 2 cores
    assert "Traceback" not in stderr
    name = signal.Signals(signum).name
    assert [line for line in stderr.splitlines() if "interrupted" in line] == [f"interrupted by {name}"]
    assert stderr.strip().splitlines()[-1] == f"interrupted by {name}"
    closing = (tmp_path / "run" / "run.log").read_text().strip().splitlines()[-1]
    assert closing.endswith(f"run interrupted by {name}, exit status {status}"), closing


@pytest.mark.slow  # starts TensorFlow and indexes the sample before it waits
def test_a_run_that_gets_no_batch_within_the_service_timeout_fails_in_one_line(workerless_dispatcher, tmp_path):
    address = workerless_dispatcher
    result = run_cli(*SMALL_RUN, f"pipeline.service={address}", "pipeline.service_timeout=2",
                     f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    assert_error(result, 1, address, "pipeline.service_timeout=2", "no worker",
                 f"`python -m tf_harness.data.service worker --dispatcher {address}`")


@pytest.mark.slow  # starts two TensorFlow servers beside the benchmark
def test_the_service_benchmark_prints_its_rows_and_ratios(private_folders):
    result = subprocess.run([sys.executable, "-m", "benchmarks", "service", "--workers", "1", "--repeats", "1", "--seconds",
                             "0.5"], cwd=PROJECT, capture_output=True, text=True, timeout=600,
                            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "command: python -m benchmarks service --workers 1 --repeats 1 --seconds 0.5" in out
    assert "chest_xray, 64 px, batch 16" in out and "load average" in out
    rows = {line.split("  ")[1].strip(): line.split()[-4:] for line in out.splitlines()
            if line.startswith("  file pipeline") or line.startswith("  through")}
    assert set(rows) == {"file pipeline, read here", "through a localhost dispatcher, 1 worker(s)"}
    assert all(float(value) > 0 for values in rows.values() for value in values)
    assert "images/s" in out.split("ratio to the local row")[1] and "per CPU-s" in out
    written = private_folders["HARNESS_BENCHMARK_RESULTS"].glob("*-service.json")
    assert [json.loads(path.read_text())["command"] for path in written] == \
        ["python -m benchmarks service --workers 1 --repeats 1 --seconds 0.5"]


class _NotGrpc:
    """A TCP server on localhost that is no gRPC server: it accepts and says nothing, or answers `reply` and
    closes. Its port is `port`."""

    def __init__(self, reply=None):
        import threading

        self.listener = socket.create_server(("localhost", 0))
        self.port, self.reply, self.accepted = self.listener.getsockname()[1], reply, []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:  # closed
                return
            self.accepted.append(connection)
            if self.reply is not None:
                connection.sendall(self.reply)
                connection.close()

    def close(self):
        self.listener.close()
        for connection in self.accepted:
            connection.close()


@pytest.mark.parametrize("reply, why", [
    (None, "timed out"), (b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n", "no HTTP/2 SETTINGS frame")])
def test_a_server_that_is_not_a_dispatcher_is_one_line_not_a_wait(monkeypatch, workerless_dispatcher, reply, why):
    from tf_harness.data import service
    from tf_harness.data.errors import ConfigError

    if reply is None:  # the silent server is waited for until the timeout; one that answers is not
        monkeypatch.setattr(service, "_CONNECT_SECONDS", 1)
    server = _NotGrpc(reply)
    address = f"grpc://localhost:{server.port}"
    try:
        with raises_naming(ConfigError, f"pipeline.service={address}", "not a gRPC one", why,
                           f"`python -m tf_harness.data.service dispatcher --port {server.port}`"):
            service.check_dispatcher(address)
    finally:
        server.close()
    service.check_dispatcher(workerless_dispatcher)  # a dispatcher, even without a worker, passes


@pytest.mark.slow  # starts TensorFlow and indexes the sample before it checks the address
def test_a_run_pointed_at_a_server_that_is_not_a_dispatcher_exits_2_leaving_no_folder(tmp_path):
    server = _NotGrpc()
    try:
        result = run_cli(*SMALL_RUN, f"pipeline.service=grpc://localhost:{server.port}",
                         f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    finally:
        server.close()
    assert_config_error(result, f"pipeline.service=grpc://localhost:{server.port}", "not a gRPC one", alone=False)
    assert not (tmp_path / "run").exists()


# ----- signals and a dead dispatcher ----------------------------------------------------------------------------------


def test_a_stalled_run_names_a_dispatcher_that_is_gone_as_gone():
    from tf_harness.data import service

    address = f"grpc://localhost:{_free_port()}"  # nothing listens there: the dispatcher was killed
    line = service.stalled(address, 300)
    assert "its dispatcher no longer answers" in line and "has no worker" not in line, line


def test_a_stalled_run_whose_dispatcher_answers_says_it_has_no_worker(workerless_dispatcher):
    from tf_harness.data import service

    line = service.stalled(workerless_dispatcher, 300)
    assert "its dispatcher has no worker" in line and "no longer answers" not in line, line


CONSUMER = """
import sys, time
import tensorflow as tf
data = tf.data.Dataset.range(10 ** 9).map(lambda x: tf.fill([64, 64], x)).apply(
    tf.data.experimental.service.distribute("distributed_epoch", sys.argv[1]))
for number, _ in enumerate(data):
    if number == 5:
        print("consuming", flush=True)
    time.sleep(0.01)
"""


@pytest.mark.slow  # a dispatcher, a worker and a consumer start TensorFlow: about a minute on 2 cores
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_whose_dispatcher_was_killed_mid_job_stops_at_a_signal_within_seconds(tmp_path, signum):
    port = _free_port()
    address = f"grpc://localhost:{port}"
    dispatcher = Server(tmp_path / "dispatcher.log", "dispatcher", "--port", str(port), "--host", "localhost")
    dispatcher.wait_for("Dispatcher listening")
    worker = Server(tmp_path / "worker.log", "worker", "--dispatcher", address, "--host", "localhost")
    worker.wait_for("Worker started")
    consumer_log = tmp_path / "consumer.log"
    with open(consumer_log, "w") as output:
        consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, address], stdout=output, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    try:
        deadline = time.monotonic() + 300
        while "consuming" not in consumer_log.read_text():
            assert consumer.poll() is None and time.monotonic() < deadline, consumer_log.read_text()[-3000:]
            time.sleep(0.2)
        dispatcher.process.kill()  # mid-job: the worker serves a task of the consumer's
        dispatcher.process.wait()
        time.sleep(3)
        sent = time.monotonic()
        worker.process.send_signal(signum)
        try:
            status = worker.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            status = None
        took = time.monotonic() - sent
    finally:
        for process in (consumer, worker.process, dispatcher.process):
            process.kill()
    log = worker.log_path.read_text()
    assert status == 0, (status, log[-2000:])
    assert took < 10, took
    assert f"Worker stopped by {signal.Signals(signum).name}" in log, log[-2000:]


def test_the_waiting_line_names_a_dispatcher_that_is_gone(workerless_dispatcher):
    from tf_harness.data import service

    assert "its dispatcher no longer answers" in service.waiting_hint(f"grpc://localhost:{_free_port()}")
    assert "is a worker running?" in service.waiting_hint(workerless_dispatcher)


def test_a_waiting_line_asks_its_hint_afresh(caplog, monkeypatch):
    from tf_harness.experiments.run_dir import blocking

    monkeypatch.setattr(blocking, "INTERVAL", 0.3)
    asked = []
    with caplog.at_level(logging.WARNING):
        blocking.call(time.sleep, 1.0, what="a batch", hint=lambda: asked.append(1) or f"asked {len(asked)}")
    assert "(asked 1)" in caplog.text and "(asked 2)" in caplog.text
