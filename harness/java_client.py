"""The Java client (org.apache.kafka:kafka-clients) as a real test client (issues 27 and 28).

Owns the pinned kafka-clients version (`JAVA_CLIENT_VERSION`), the build of tests/clients/java
(`build`, run by `make setup` as `python3 -m harness.java_client build`: Maven packages
CensusJavaClient with its runtime jars into build/java-client/<version>/), and running it:
`java_client_command`, `run_java_client` (the bounded script of every test client, under a hard
timeout) and `holding_java_client` (`--hold`: connected, in its group, until released). Usable
from pytest, scripts and benchmarks; imports nothing from the project but harness/, and nothing
here downloads anything at test time.

The client announces itself (KIP-511) as `SOFTWARE_NAME` with its kafka-clients version. One
source serves every release from 0.10.2 to 4.x (tests/clients/java/pom.xml says how); `build`
takes any version, so that issue 28 can record the old ones.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from harness.peers import PeerError, fresh_name, parse_report
from harness.process import pdeathsig_preexec

REPO_ROOT = Path(__file__).resolve().parent.parent
SOURCE_DIR = REPO_ROOT / "tests" / "clients" / "java"
JARS_DIR = REPO_ROOT / "build" / "java-client"
#: The kafka-clients release the tests run, the newest that resolves (docs/dependencies.md).
JAVA_CLIENT_VERSION = "4.4.0"
MAIN_CLASS = "CensusJavaClient"
#: What the client announces in ApiVersions v3+ (KIP-511, from kafka-clients 2.4).
SOFTWARE_NAME = "apache-kafka-java"
SETUP_HINT = "run `make setup` (Maven builds tests/clients/java into build/java-client/)"
# A small heap and the quick JIT tier: the client's script is a few seconds on 2 shared cores.
JVM_OPTIONS = ("-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true")


def jars(version: str = JAVA_CLIENT_VERSION) -> Path:
    return JARS_DIR / version


def missing_java_client(version: str = JAVA_CLIENT_VERSION) -> str | None:
    """Why the Java client of `version` cannot run here (with the install hint), or None."""
    if shutil.which("java") is None:
        return "java is not on PATH: the Java client needs a Java 17 runtime (apt-get install -y openjdk-17-jre)"
    if not (jars(version) / f"kafka-clients-{version}.jar").is_file() or \
            not (jars(version) / "census-java-client.jar").is_file():
        return f"the Java client with kafka-clients {version} is not built in {jars(version)}: {SETUP_HINT}"
    return None


def java_client_command(bootstrap: str, topic: str, group: str, *, version: str = JAVA_CLIENT_VERSION,
                        extra_args: Sequence[str] = ()) -> list[str]:
    """The command line of the Java client; `extra_args` go after the common ones, e.g.
    `("--client-id", ID)`, `("--ca", PEM, "--cert", PEM, "--key", PEM)`,
    `("--sasl-mechanism", "PLAIN", "--sasl-user", U, "--sasl-password", P)` or `("--hold",)`."""
    return [shutil.which("java") or "java", *JVM_OPTIONS, "-cp", str(jars(version) / "*"), MAIN_CLASS,
            "--bootstrap", bootstrap, "--topic", topic, "--group", group, *extra_args]


def _start(cmd: list[str], *, stdin, stderr) -> subprocess.Popen:
    # Its own process group (killed whole), and SIGTERM if this process dies first.
    return subprocess.Popen(cmd, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            cwd=str(REPO_ROOT), start_new_session=True, preexec_fn=pdeathsig_preexec())


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def run_java_client(bootstrap: str, topic: str | None = None, group: str | None = None, timeout: float = 60.0,
                    *, version: str = JAVA_CLIENT_VERSION, check: bool = True,
                    extra_args: Sequence[str] = ()) -> tuple[int, str, str]:
    """Run the Java client's script against `bootstrap`; return (returncode, stdout, stderr).

    Killed with its process group after `timeout` seconds, or when the wait is interrupted.
    With `check` (the default) a non-zero exit or a timeout raises PeerError carrying its
    output, as harness.peers.run_client does for the other clients."""
    why = missing_java_client(version)
    if why:
        raise PeerError(why)
    topic = topic or fresh_name("census-java")
    group = group or fresh_name("census-java-group")
    proc = _start(java_client_command(bootstrap, topic, group, version=version, extra_args=extra_args),
                  stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc)
        out, err = proc.communicate()
        raise PeerError(f"the Java client timed out after {timeout:.0f} s\n--- stdout ---\n{out}\n"
                        f"--- stderr ---\n{err[-6000:]}") from None
    except BaseException:  # Ctrl-C: nothing started here outlives the caller
        _kill(proc)
        proc.communicate()
        raise
    if check and proc.returncode != 0:
        raise PeerError(f"the Java client exited with code {proc.returncode}\n--- stdout ---\n{out}\n"
                        f"--- stderr ---\n{err[-6000:]}")
    return proc.returncode, out, err


@contextlib.contextmanager
def holding_java_client(bootstrap: str, topic: str | None = None, group: str | None = None, *,
                        version: str = JAVA_CLIENT_VERSION, extra_args: Sequence[str] = (),
                        timeout: float = 90.0, close_timeout: float = 30.0) -> Iterator[dict]:
    """The Java client with `--hold`, as harness.peers.holding_client runs the others: wait (at
    most `timeout` s) until it has done its script and holds its producer and consumer open, and
    yield its holding line (its report so far, with `pid`). Leaving the block closes its standard
    input; it must then close cleanly, exit 0 and report ok within `close_timeout` s, else
    PeerError with its output. Exiting or staying silent before holding is a PeerError too; on
    any failure (an exception in the block, Ctrl-C) its process group is killed."""
    why = missing_java_client(version)
    if why:
        raise PeerError(why)
    topic = topic or fresh_name("census-java")
    group = group or fresh_name("census-java-group")
    cmd = java_client_command(bootstrap, topic, group, version=version, extra_args=[*extra_args, "--hold"])
    with tempfile.TemporaryFile("w+") as stderr:  # a file: a full pipe would stall the client
        proc = _start(cmd, stdin=subprocess.PIPE, stderr=stderr)
        lines: queue.Queue[str | None] = queue.Queue()  # None: stdout closed
        out: list[str] = []

        def read_stdout() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                out.append(line)
                lines.put(line)
            lines.put(None)

        reader = threading.Thread(target=read_stdout, name="java-client-stdout", daemon=True)
        reader.start()

        def output() -> str:
            reader.join(10)
            stderr.seek(0)
            return f"--- stdout ---\n{''.join(out)}\n--- stderr ---\n{stderr.read()[-6000:]}"

        def failure(what: str) -> PeerError:
            _kill(proc)
            proc.wait()
            return PeerError(f"the held Java client {what}\n{output()}")

        try:
            try:
                holding = _holding_line(lines, time.monotonic() + timeout)
            except queue.Empty:
                raise failure(f"was not holding within {timeout:g} s") from None
            if holding is None:
                raise failure(f"exited with code {proc.wait()} before holding")
            yield holding
        except BaseException:
            _kill(proc)
            proc.wait()
            raise
        assert proc.stdin is not None
        with contextlib.suppress(OSError):  # it may be gone already: its exit code says why
            proc.stdin.close()  # the release: it closes everything and reports
        try:
            code = proc.wait(close_timeout)
        except subprocess.TimeoutExpired:
            raise failure(f"did not exit within {close_timeout:g} s of its release") from None
        text = output()
        try:
            report = parse_report("".join(out))
        except PeerError:
            report = {}
        if code != 0 or report.get("ok") is not True or report.get("holding"):
            raise PeerError(f"the held Java client exited with code {code} after holding\n{text}")


def _holding_line(lines: queue.Queue[str | None], deadline: float) -> dict | None:
    """The client's `{"holding": true, ...}` line, or None if its stdout ended first; raises
    queue.Empty past `deadline`."""
    while True:
        line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        if line is None:
            return None
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                parsed = json.loads(line)
                if isinstance(parsed, dict) and parsed.get("holding") is True:
                    return parsed


# ----------------------------------------------------------------------------- building


def build(versions: Sequence[str] = (JAVA_CLIENT_VERSION,)) -> None:
    """`make setup`: Maven compiles tests/clients/java against kafka-clients of each version and
    puts the class and its runtime jars into build/java-client/<version>/ (its output directory
    is under build/ too). Its local repository caches the jars, as for the brokers."""
    mvn = shutil.which("mvn")
    if mvn is None or shutil.which("javac") is None:
        raise SystemExit("error: mvn or javac not found: install Maven and a Java 17 JDK "
                         "(apt-get install -y maven openjdk-17-jdk)")
    pom = SOURCE_DIR / "pom.xml"
    for version in versions:
        target = jars(version)
        print(f"Java client, kafka-clients {version}: Maven builds {pom.relative_to(REPO_ROOT)} into "
              f"{os.path.relpath(target, REPO_ROOT)}", flush=True)
        shutil.rmtree(target, ignore_errors=True)
        shutil.rmtree(JARS_DIR / "maven" / version, ignore_errors=True)
        cmd = [mvn, "-q", "-B", "-f", str(pom), *_profiles(version), f"-Dkafka.clients.version={version}",
               f"-Djava.client.dir={target}", "package"]
        done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"error: {' '.join(cmd[3:])} failed (exit {done.returncode}):\n{done.stdout[-3000:]}"
                             f"{done.stderr[-2000:]}")
        why = missing_java_client(version)
        if why:
            raise SystemExit(f"error: Maven ran, but {why}")


def _profiles(version: str) -> list[str]:
    """The Maven profiles of old kafka-clients (tests/clients/java/pom.xml): before 0.11 no admin
    client, before 1.0 the JAXB API for SCRAM."""
    release = tuple(int(p) for p in version.split(".")[:2])
    return (["-Pno-admin-client"] if release < (0, 11) else []) + (["-Pjaxb-api"] if release < (1, 0) else [])


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["build"]:
        raise SystemExit("usage: python -m harness.java_client build [KAFKA_CLIENTS_VERSION ...]")
    build(sys.argv[2:] or (JAVA_CLIENT_VERSION,))
