"""The tf.data service: training input decoded on other machines' cores (``pipeline.service``).

One dispatcher hands out the work; each worker runs the training pipeline up to its batches (read,
shuffle, decode, resize, batch) and streams uint8 batches to the trainer, which only augments and
normalises them in its step. Start them with::

    python -m tf_harness.data.service dispatcher --port 5050
    python -m tf_harness.data.service worker --dispatcher grpc://HOST:5050     # on each machine with spare cores

A worker needs TensorFlow and the image files (or TFRecord shards) at the paths the trainer indexed
them under; the pipeline's graph comes from the trainer. SIGINT or SIGTERM ends a server at once
(exit 0), whatever it waits on; a dispatcher that cannot be reached, or an address that is not ``grpc://host:port``, is one
line on stderr and exit status 2, as a config error is for run.py.
"""
import argparse
import logging
import os
import re
import signal
import socket
import sys
import threading

import tensorflow as tf

from tf_harness.data.errors import ConfigError

log = logging.getLogger(__name__)
# grpc://host:port, the host a name, an IPv4 address or a bracketed IPv6 one. experiments/config/schema.py checks
# pipeline.service against the same pattern before TensorFlow starts.
ADDRESS = re.compile(r"grpc://(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):(?P<port>[0-9]{1,5})")
_CONNECT_SECONDS = 5
# HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113, 3.4); a server's first frame is SETTINGS.
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_SETTINGS = 4


def split_address(address, key="pipeline.service") -> tuple:
    """(host, port) of a ``grpc://host:port`` address; ConfigError, naming `key`, when it has another form."""
    match = ADDRESS.fullmatch(str(address))
    if not match or not 1 <= int(match["port"]) <= 65535:
        raise ConfigError(f"{key}={address} is not grpc://host:port (a port in 1..65535)")
    return match["host"].strip("[]"), int(match["port"])


def check_dispatcher(address, key="pipeline.service") -> None:
    """Raises ConfigError, in one line, unless a gRPC server accepts connections at the dispatcher's address.

    Without this, a trainer or a worker pointed at a wrong address would wait on it silently."""
    host, port = split_address(address, key)
    start = f"start one with `python -m tf_harness.data.service dispatcher --port {port}`"
    try:
        connection = socket.create_connection((host, port), timeout=_CONNECT_SECONDS)
    except OSError as error:
        raise ConfigError(f"{key}={address}: no tf.data service dispatcher answers there "
                          f"({error.strerror or error}); {start}") from None
    with connection:
        problem = _not_grpc(connection)
    if problem:
        raise ConfigError(f"{key}={address}: a server listens there, but not a gRPC one as a tf.data service "
                          f"dispatcher is ({problem}); check the port, or {start}")


def _not_grpc(connection) -> str | None:
    """Why the server at the other end of `connection` is not a gRPC server, or None when it is one.

    A dispatcher is a gRPC server, which answers HTTP/2's connection preface with a SETTINGS frame. Another kind
    of server (TensorBoard's port, say) would take TensorFlow's registration and never answer it, and the run
    would wait in C++, deaf to SIGINT and SIGTERM."""
    header = b""
    try:
        connection.sendall(_HTTP2_PREFACE)
        while len(header) < 9:
            received = connection.recv(9 - len(header))
            if not received:
                break
            header += received
    except OSError as error:
        return f"{error.strerror or error} in answer to HTTP/2's preface"
    if len(header) < 9 or header[3] != _SETTINGS:
        return "no HTTP/2 SETTINGS frame in answer to its preface"
    return None


def distribute(data, address) -> tf.data.Dataset:
    """`data`, produced by the tf.data service's workers and streamed to this process.

    The processing mode is ``distributed_epoch`` (ShardingPolicy.DYNAMIC): the dispatcher hands each
    worker a disjoint share of the source's records (table rows, TFRecord files, LFW's pair indices)
    as it asks for more, so each epoch still sees every example once, however many workers join.
    With ``parallel_epochs`` every worker would run the whole seeded pipeline, and the trainer would
    get every batch once per worker.

    Elements cross uncompressed: they are decoded uint8 pixels, which compress little, and
    decompressing them would spend the trainer's CPU, the resource the service is there to spare.
    """
    check_dispatcher(address)
    log.info("Training input from the tf.data service at %s: its workers read, decode and batch (they need "
             "the dataset's files at the same paths); augmentation stays in the train step", address)
    return data.apply(tf.data.experimental.service.distribute(
        tf.data.experimental.service.ShardingPolicy.DYNAMIC, address, compression=None))


def start_worker(address) -> str:
    """What to do when no batch comes from the dispatcher at `address`, in words: start a worker."""
    return f"start one with `python -m tf_harness.data.service worker --dispatcher {address}`"


def waiting_hint(address) -> str:
    """What a run waiting for batches from the dispatcher at `address` should look at, in words, as things are now."""
    if not _answers(address):
        return f"pipeline.service={address}: its dispatcher no longer answers (stopped or killed); {_restart(address)}"
    return f"pipeline.service={address}: is a worker running? {start_worker(address)}"


def _restart(address) -> str:
    return (f"start it again with `python -m tf_harness.data.service dispatcher --port {split_address(address)[1]}` "
            f"(with --work-dir, a restarted one resumes)")


def stalled(address, seconds) -> str:
    """The error line of a run that got no training batch from the dispatcher at `address` in `seconds`
    (pipeline.service_timeout): a dispatcher that no longer answers is named as gone; one that answers has no
    worker that serves (a dispatcher without a worker accepts the trainer and never answers it)."""
    head = f"no training batch came from the tf.data service at {address} in pipeline.service_timeout={seconds:g} s"
    if not _answers(address):
        return f"{head}: its dispatcher no longer answers (stopped or killed); {_restart(address)}, then run the " \
               f"same command again"
    return f"{head}: its dispatcher has no worker, or none that can read the dataset's files; {start_worker(address)}"


# ----- python -m tf_harness.data.service: the servers -------------------------------------------------------------------


def _serve(server, what) -> None:
    """Serves until SIGINT or SIGTERM, then ends the process at once, exit status 0, the server with it.

    `server.stop()` is not called: TensorFlow's stop holds the GIL while it waits for the tasks of jobs still open
    (a trainer that went away is only forgotten after minutes) or for a dispatcher that is gone, so neither a
    thread given a bound nor a second signal could end that wait. A process that exits ends its server as surely,
    and the dispatcher learns of a worker gone from its missed heartbeats, as after a crash."""
    stop = threading.Event()
    received = []

    def handle(signum, _frame):
        received.append(signal.Signals(signum).name)
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, handle)
    while not stop.wait(1.0):
        pass
    log.info("%s stopped by %s", what, received[0])
    logging.shutdown()
    os._exit(0)  # an orderly exit would stop the server from its finalizer, and wait as stop() does


def _answers(address) -> bool:
    """Whether a server accepts connections at `address` (grpc://host:port) within a second."""
    try:
        socket.create_connection(split_address(address), timeout=1).close()
    except OSError:
        return False
    return True


def run_dispatcher(args) -> None:
    config = tf.data.experimental.service.DispatcherConfig(port=args.port, work_dir=args.work_dir,
                                                           fault_tolerant_mode=bool(args.work_dir))
    server = tf.data.experimental.service.DispatchServer(config)
    address = f"grpc://{args.host}:{args.port}"
    log.info("Dispatcher listening on port %d. Start workers with `python -m tf_harness.data.service worker --dispatcher %s` "
             "and train with `python run.py ... pipeline.service=%s`", args.port, address, address)
    _serve(server, "Dispatcher")


def run_worker(args) -> None:
    host, port = split_address(args.dispatcher, "--dispatcher")
    check_dispatcher(args.dispatcher, "--dispatcher")
    # The trainer fetches batches from the address the worker registers with, so it must be one the
    # trainer can reach: this machine's name unless --host says otherwise.
    config = tf.data.experimental.service.WorkerConfig(dispatcher_address=f"{host}:{port}", port=args.port,
                                                       worker_address=f"{args.host}:%port%")
    server = tf.data.experimental.service.WorkerServer(config)
    log.info("Worker started as %s:%s; it registers with the dispatcher at %s", args.host,
             args.port or "(a free port)", args.dispatcher)
    _serve(server, "Worker")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tf_harness.data.service", description=__doc__.split("\n")[0])
    servers = parser.add_subparsers(dest="server", required=True)
    dispatcher = servers.add_parser("dispatcher", help="start the dispatcher")
    dispatcher.add_argument("--port", type=int, default=5050)
    dispatcher.add_argument("--host", default=socket.getfqdn(), help="this machine's name, for the logged commands")
    dispatcher.add_argument("--work-dir", default=None,
                            help="a folder where the dispatcher keeps its state, so a restarted one resumes")
    worker = servers.add_parser("worker", help="start a worker")
    worker.add_argument("--dispatcher", required=True, help="grpc://host:port of the dispatcher")
    worker.add_argument("--port", type=int, default=0, help="the port to serve on (default: a free one)")
    worker.add_argument("--host", default=socket.getfqdn(), help="the name trainers reach this machine by")
    return parser


def main(argv=None) -> int:
    """The command line; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        (run_dispatcher if args.server == "dispatcher" else run_worker)(args)
    except ConfigError as error:
        print(f"config error: {error}", file=sys.stderr)
        return 2
    except tf.errors.OpError as error:  # e.g. the port is taken
        print(f"error: the {args.server} could not start: {error.message.splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
