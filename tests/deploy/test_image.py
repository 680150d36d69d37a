"""The image: the Dockerfile, its build context, and the capture launcher, the one file of the
image that carries a capability.

What runs here and what cannot:
- No Docker daemon: the image is never built. The Dockerfile's structure is checked as text
  (pinned bases, numeric USER, entry point, the stripping of setuid/setgid bits, the launcher as
  the only capable file), and so is the allow-listed build context.
- The launcher's C source is a heredoc of the Dockerfile: the tests compile that very source
  with the Dockerfile's own compiler flags and this machine's cc, pointed (KC_PYTHON) at this
  checkout's interpreter instead of the image's /opt/kafka-census/bin/python, and run it: it
  runs `kafka-census capture` only, isolated (-I), with an environment of KAFKA_CENSUS_*
  settings only (LD_PRELOAD, PYTHONPATH, PYTHONSTARTUP, PYTHONHOME dropped), and reaches the
  real CLI.
- The capability, run for real (needs root, to set the file capability and switch users): the
  Dockerfile's own script writes it (and checks that no other file carries one), `getcap`
  reads it back when installed, and the child replays what a container runtime (runc) does
  before the container's first exec under the chart's securityContext: bounding set NET_RAW,
  UID 10001 with NET_RAW permitted and effective (`capabilities: {drop: [ALL], add: [NET_RAW]}`),
  no_new_privs (`allowPrivilegeEscalation: false`). The real capture then opens its AF_PACKET
  socket on lo through the launcher, and cannot through a copy without the capability, through
  the interpreter itself, or without NET_RAW in the container.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.e2e  # builds the launcher with cc and runs kafka-census through it

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
CHART = ROOT / "helm" / "kafka-census"
LAUNCHER = "/opt/kafka-census/bin/kafka-census-capture"
UID = 10001
CAP_NET_RAW = 13


# --- the Dockerfile as text ------------------------------------------------------------------

def dockerfile_instructions() -> list[tuple[str, str, list[str]]]:
    """(INSTRUCTION, arguments, heredoc bodies) with continuation lines joined, comments dropped."""
    out, pending = [], ""
    lines = iter(DOCKERFILE.read_text().splitlines())
    for line in lines:
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full = (pending + line).strip()
        pending = ""
        word, _, rest = full.partition(" ")
        bodies = []
        for delimiter in re.findall(r'<<-?"?(\w+)"?', rest):
            body = []
            for body_line in lines:
                if body_line == delimiter:
                    break
                body.append(body_line)
            else:
                pytest.fail(f"heredoc {delimiter} is not closed")
            bodies.append("\n".join(body) + "\n")
        out.append((word.upper(), rest.strip(), bodies))
    assert not pending, "the Dockerfile ends in a line continuation"
    return out


def stages() -> dict[str, list[tuple[str, str, list[str]]]]:
    """Instructions by stage name ("" for the last, unnamed one)."""
    out, name = {}, None
    for word, args, bodies in dockerfile_instructions():
        if word == "FROM":
            m = re.search(r"\sAS\s+(\S+)$", args, re.I)
            name = m.group(1) if m else ""
            out[name] = []
        out[name].append((word, args, bodies))
    return out


def launcher_source() -> str:
    [source] = [bodies[0] for word, args, bodies in stages()["launcher"]
                if word == "COPY" and args.startswith("<<") and args.endswith(".c")]
    return source


def launcher_compile_command() -> list[str]:
    """The Dockerfile's gcc command line, as a list, with its output and source."""
    [run] = [args for word, args, _ in stages()["launcher"] if word == "RUN" and args.startswith("gcc ")]
    return run.split()


def capability_script() -> tuple[str, list[str]]:
    """The final stage's script that sets the launcher's capability, and its arguments."""
    [(args, body)] = [(args, bodies[0]) for word, args, bodies in stages()[""]
                      if word == "RUN" and "security.capability" in "".join(bodies)]
    m = re.fullmatch(r'python3 - (?P<argv>.*?) <<"EOF"', args)
    assert m, args
    return body, m["argv"].split()


def test_dockerfile_structure():
    by_stage = stages()
    assert list(by_stage) == ["build", "launcher", ""], "build the venv, compile the launcher, then the runtime"
    for _word, args, _ in (i for s in by_stage.values() for i in s if i[0] == "FROM"):
        image = args.split()[0]
        m = re.fullmatch(r"(?P<name>[a-z0-9./-]+):(?P<tag>[\w.-]+)@sha256:[0-9a-f]{64}", image)
        assert m, f"FROM {image}: pin both a tag and a digest"
        assert m["tag"] != "latest" and m["tag"].startswith("3.11"), image
    assert "latest" not in DOCKERFILE.read_text().lower()
    final = by_stage[""]
    users = [args for word, args, _ in final if word == "USER"]
    assert users and re.fullmatch(r"[1-9][0-9]*(:[1-9][0-9]*)?", users[-1]), "USER must be a numeric non-root uid"
    assert users[-1].split(":")[0] == str(yaml.safe_load((CHART / "values.yaml").read_text())["runAsUser"]) == str(UID)
    entry = [args for word, args, _ in final if word == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == ["kafka-census"]
    copies = [args for word, args, _ in final if word == "COPY"]
    assert copies == ["--from=build /opt/kafka-census /opt/kafka-census",
                      f"--from=launcher /kafka-census-capture {LAUNCHER}"]
    exposed = [args for word, args, _ in final if word == "EXPOSE"]
    assert exposed == [str(yaml.safe_load((CHART / "values.yaml").read_text())["http"]["port"])]
    # no compiler in the runtime image: gcc is the build stages' only (the hot path, the launcher)
    assert not any("apt-get" in args for word, args, _ in by_stage[""] if word == "RUN")
    assert any("gcc" in args for word, args, _ in by_stage["build"] if word == "RUN")
    # the interpreter of old (a copy with cap_net_raw) is gone
    assert "netraw" not in DOCKERFILE.read_text()


def test_no_setuid_file_and_one_capable_file_last():
    """The final stage strips every setuid/setgid bit and checks none is left, before it sets
    the one capability; the capability is the last RUN (a later write or chown clears it)."""
    runs = [(args, bodies) for word, args, bodies in stages()[""] if word == "RUN"]
    strip = "find / -xdev -perm /6000 -type f -exec chmod a-s {} +"
    [strip_run] = [i for i, (args, _) in enumerate(runs) if strip in args]
    assert 'test -z "$(find / -xdev -perm /6000 -type f)"' in runs[strip_run][0]
    body, argv = capability_script()
    assert runs[-1][1] == [body] and strip_run < len(runs) - 1
    assert argv == ["/", LAUNCHER]


def test_dockerignore_keeps_the_context_to_what_the_build_copies():
    patterns = [p.strip() for p in (ROOT / ".dockerignore").read_text().splitlines()
                if p.strip() and not p.startswith("#")]
    assert patterns[0] == "*", "an allow-list: .venv, .git, tests and bench data stay out"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    copied = set()
    for word, args, _ in dockerfile_instructions():
        if word == "COPY" and not args.startswith(("--from", "<<")):  # a heredoc is not from the context
            copied.update(a.rstrip("/") for a in args.split()[:-1])
    assert copied == allowed
    for path in copied:
        assert (ROOT / path).exists(), path


# --- the launcher, compiled from the Dockerfile's source --------------------------------------

PROGRAM = "import sys; from exporter.cli.main import main; sys.exit(main(sys.argv[1:]))"


def compile_launcher(directory: Path, python: str, name: str = "kafka-census-capture") -> Path:
    if shutil.which("cc") is None:
        pytest.skip("no C compiler (cc) on this machine")
    (directory / "kafka-census-capture.c").write_text(launcher_source())
    command = launcher_compile_command()
    assert command[0] == "gcc" and command[-3] == "-o" and command[-1] == "/src/kafka-census-capture.c"
    out = directory / name
    built = subprocess.run(["cc", *command[1:-3], f'-DKC_PYTHON="{python}"', "-o", str(out),
                            str(directory / "kafka-census-capture.c")], capture_output=True, text=True, timeout=120)
    assert built.returncode == 0, built.stderr  # -Wall -Wextra -Werror: no warning either
    return out


@pytest.fixture(scope="module")
def workdir():
    """A directory UID 10001 can reach (pytest's tmp_path is private to root)."""
    path = Path(tempfile.mkdtemp(prefix="kafka-census-image-"))
    os.chmod(path, 0o755)
    yield path
    shutil.rmtree(path)


def test_launcher_source_holds_the_fixed_program():
    source = launcher_source()
    assert f'#define KC_PROGRAM "{PROGRAM}"' in source
    assert '#define KC_PYTHON "/opt/kafka-census/bin/python"' in source
    # the program is the console script's own entry point
    import tomllib
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]["kafka-census"] == \
        "exporter.cli.main:main"


def fake_interpreter(directory: Path) -> tuple[Path, Path]:
    """Stands in for the interpreter: records the arguments and environment it was given."""
    record = directory / "record.json"
    fake = directory / "fake-python"
    fake.write_text(f"#!{sys.executable} -I\nimport json, os, sys\n"
                    f"open({str(record)!r}, 'w')"
                    ".write(json.dumps({'argv': sys.argv[1:], 'env': dict(os.environ)}))\n")
    fake.chmod(0o755)
    return fake, record


@pytest.mark.parametrize("argv", [[], ["api-table"], ["pipeline"], ["Capture"], ["-c", "import os"], ["-I", "capture"],
                                  ["-m", "exporter.cli.main", "capture"], ["--version"]],
                         ids=["none", "api-table", "pipeline", "case", "c", "I", "m", "version"])
def test_launcher_refuses_anything_but_capture(tmp_path, argv):
    fake, record = fake_interpreter(tmp_path)
    launcher = compile_launcher(tmp_path, str(fake))
    run = subprocess.run([str(launcher), *argv], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr == ("kafka-census-capture: runs `kafka-census capture [OPTIONS]` only; "
                          "for anything else run kafka-census\n")
    assert not record.exists(), "nothing was executed"


def test_launcher_passes_a_fixed_program_and_only_the_settings(tmp_path):
    """Every argument after `capture` goes to the program (after -c PROGRAM they are never the
    interpreter's options); the environment is PATH, LANG and the KAFKA_CENSUS_* settings."""
    fake, record = fake_interpreter(tmp_path)
    launcher = compile_launcher(tmp_path, str(fake))
    hostile = {"LD_PRELOAD": "/tmp/evil.so", "LD_LIBRARY_PATH": "/tmp", "PYTHONPATH": "/tmp",
               "PYTHONSTARTUP": "/tmp/s.py", "PYTHONHOME": "/tmp", "PYTHONINSPECT": "1", "PYTHONWARNINGS": "error",
               "BASH_ENV": "/tmp/x", "HOME": "/root", "KAFKA_CENSUSX": "no", "kafka_census_log_level": "no"}
    env = {**hostile, "KAFKA_CENSUS_LOG_LEVEL": "debug", "KAFKA_CENSUS_INTERFACE": "eth0", "PATH": "/tmp"}
    args = ["capture", "--interface=lo", "-c", "print(1)", "-m", "x", "--", "-I"]
    run = subprocess.run([str(launcher), *args], env=env, capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr
    got = json.loads(record.read_text())
    assert got["argv"] == ["-I", "-B", "-u", "-c", PROGRAM, *args]
    # the fake's own interpreter may add LC_CTYPE (PEP 538 locale coercion): nothing else
    assert {k: v for k, v in got["env"].items() if k != "LC_CTYPE"} == {
        "PATH": "/opt/kafka-census/bin:/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8",
        "KAFKA_CENSUS_LOG_LEVEL": "debug", "KAFKA_CENSUS_INTERFACE": "eth0"}


PRELOAD = r"""
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void mark(void) {
    char exe[4096] = {0}, path[4200];
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) return;
    snprintf(path, sizeof path, "%s/%d", MARKS, (int)getpid());
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) { write(fd, exe, sizeof exe); close(fd); }
}
"""


def test_launcher_runs_the_real_cli_isolated(tmp_path):
    """The real interpreter and CLI behind the launcher, with a hijack waiting at every door the
    environment or the current directory opens: none is taken. LD_PRELOAD demonstrably works on
    this machine (it marks the launcher itself, which has no file capability here and so no
    secure exec), and never reaches the interpreter."""
    launcher = compile_launcher(tmp_path, sys.executable)
    marks = tmp_path / "marks"
    marks.mkdir()
    (tmp_path / "preload.c").write_text(PRELOAD)
    built = subprocess.run(["cc", "-shared", "-fPIC", f'-DMARKS="{marks}"', "-o", str(tmp_path / "preload.so"),
                            str(tmp_path / "preload.c")], capture_output=True, text=True, timeout=60)
    assert built.returncode == 0, built.stderr
    evil = tmp_path / "evil"
    (evil / "exporter").mkdir(parents=True)
    (evil / "exporter" / "__init__.py").write_text("")
    (evil / "exporter" / "cli.py").write_text("print('HIJACKED'); raise SystemExit(99)\n")
    (evil / "startup.py").write_text("print('HIJACKED by PYTHONSTARTUP')\n")
    env = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(tmp_path / "preload.so"), "PYTHONPATH": str(evil),
           "PYTHONSTARTUP": str(evil / "startup.py"), "PYTHONINSPECT": "1", "PYTHONHOME": "/nonexistent"}
    run = subprocess.run([str(launcher), "capture", "--help"], cwd=evil, env=env, capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("usage: kafka-census capture ") and "HIJACKED" not in run.stdout + run.stderr
    loaded = {(marks / m).read_bytes().rstrip(b"\0").decode() for m in os.listdir(marks)}
    assert loaded == {str(launcher)}, f"LD_PRELOAD reached {loaded}"
    # the KAFKA_CENSUS_* settings do reach the CLI
    run = subprocess.run([str(launcher), "capture", "-i", "lo"], cwd=evil,
                         env={"KAFKA_CENSUS_LOG_LEVEL": "loud"}, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "KAFKA_CENSUS_LOG_LEVEL: bad value 'loud'" in run.stderr


# --- the capability, as a container runtime starts the chart's capture container -------------

PR_SET_KEEPCAPS, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 8, 24, 38
LINUX_CAPABILITY_VERSION_3 = 0x20080522


def container_start(*, net_raw_added: bool, no_new_privs: bool):
    """A preexec_fn replaying runc's steps before the container's first exec: the bounding set
    (`capabilities: {drop: [ALL], add: [...]}`), UID/GID 10001 keeping capabilities, the
    permitted and effective sets of the spec (containerd and CRI-O give a non-root process the
    added capabilities there; so does Docker since moby/moby#45491 was fixed), then no_new_privs."""
    keep = {CAP_NET_RAW} if net_raw_added else set()

    def preexec() -> None:
        libc = ctypes.CDLL(None, use_errno=True)

        def check(rc: int, what: str) -> None:
            if rc != 0:
                raise OSError(ctypes.get_errno(), what)

        last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
        for cap in range(last + 1):
            if cap not in keep:
                check(libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"drop {cap} from the bounding set")
        check(libc.prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
        os.setgroups([])
        os.setresgid(UID, UID, UID)
        os.setresuid(UID, UID, UID)
        mask = sum(1 << c for c in keep)
        header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
        data = (ctypes.c_uint32 * 6)(mask, mask, 0, 0, 0, 0)  # effective, permitted, inheritable x 2
        check(libc.capset(header, data), "capset")
        if no_new_privs:
            check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")

    return preexec


CAPTURE = ["capture", "-i", "lo", "--listener", "PLAINTEXT=9", "--duration", "0.05"]
NO_PRIVILEGE = "capturing on lo needs root or CAP_NET_RAW"
NOTHING_TO_PASS_ON = "warning: kafka-census-capture: no CAP_NET_RAW to pass on"


def reachable_by_anyone(path: str) -> bool:
    parts = Path(path).parents
    return os.stat(path).st_mode & 0o001 and all(os.stat(d).st_mode & 0o001 for d in parts)


@pytest.fixture(scope="module")
def world_python(workdir) -> str:
    """An interpreter UID 10001 can execute, with this checkout's packages: a venv of the first
    interpreter of this version that everyone can reach (this one may live in root's home),
    whose .pth adds this environment's site-packages (the editable install included)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (os.path.realpath(sys.executable), f"/usr/bin/python{version}", f"/usr/local/bin/python{version}"):
        if os.path.exists(candidate) and reachable_by_anyone(os.path.realpath(candidate)):
            break
    else:
        pytest.skip(f"no python{version} that UID {UID} can execute")
    venv = workdir / "venv"
    subprocess.run([candidate, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    import site
    [site_packages] = [p for p in site.getsitepackages() if p.startswith(sys.prefix)]
    [ours] = list(venv.glob("lib/python*/site-packages"))
    (ours / "kafka-census-checkout.pth").write_text(f"import site; site.addsitedir({site_packages!r})\n")
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-I", "-c", "import exporter.cli.main, pcapy"], timeout=60).returncode == 0
    return python


@pytest.fixture(scope="module")
def capable_launcher(workdir, world_python):
    """The launcher with the Dockerfile's capability, and an identical copy without it."""
    if os.geteuid() != 0:
        pytest.skip("needs root: to set a file capability and to start processes as UID 10001")
    launcher = compile_launcher(workdir, world_python)
    plain = workdir / "kafka-census-capture-plain"
    shutil.copy2(launcher, plain)
    script, argv = capability_script()
    assert argv == ["/", LAUNCHER]
    (workdir / "setcap.py").write_text(script)
    done = subprocess.run([sys.executable, str(workdir / "setcap.py"), str(workdir), str(launcher)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return launcher, plain


def test_the_dockerfile_writes_cap_net_raw_permitted_on_the_launcher_only(capable_launcher, workdir):
    launcher, plain = capable_launcher
    assert os.getxattr(launcher, "security.capability")[:8] == (0x02000000).to_bytes(4, "little") + \
        (1 << CAP_NET_RAW).to_bytes(4, "little")
    if shutil.which("getcap"):  # libcap's reading of it, when installed
        assert subprocess.run(["getcap", str(launcher)], capture_output=True, text=True).stdout.split()[-1] == \
            "cap_net_raw=p"
        assert subprocess.run(["getcap", str(plain)], capture_output=True, text=True).stdout == ""
    # the build's check fails on a second capable file
    script, _ = capability_script()
    second = workdir / "second-capable"
    shutil.copy2(plain, second)
    os.setxattr(second, "security.capability", os.getxattr(launcher, "security.capability"))
    try:
        check = subprocess.run([sys.executable, str(workdir / "setcap.py"), str(workdir), str(launcher)],
                               capture_output=True, text=True, timeout=60)
        assert check.returncode == 1 and "files with a capability: " in check.stderr and str(second) in check.stderr
    finally:
        second.unlink()


@pytest.mark.parametrize("no_new_privs", [True, False], ids=["allowPrivilegeEscalation-false", "escalation-allowed"])
def test_capture_through_the_launcher_opens_its_socket_as_uid_10001(capable_launcher, workdir, no_new_privs):
    """The chart's capture container: the real capture, started through the launcher, opens its
    AF_PACKET socket on lo, also under no_new_privs."""
    launcher, _ = capable_launcher
    run = subprocess.run([str(launcher), *CAPTURE], cwd=workdir, env={}, capture_output=True, text=True, timeout=60,
                         preexec_fn=container_start(net_raw_added=True, no_new_privs=no_new_privs))
    assert run.returncode == 0, run.stderr
    assert "capturing on lo" in run.stderr and NOTHING_TO_PASS_ON not in run.stderr
    assert run.stdout.startswith("client ")  # the listing at the end of a --duration run


@pytest.mark.parametrize("how", ["copy-without-capability", "the-interpreter-itself", "net-raw-not-added"])
def test_capture_gets_no_capability_any_other_way(capable_launcher, workdir, world_python, how):
    """Nothing else in the image passes NET_RAW on: a copy of the launcher without the file
    capability, the interpreter run directly (as any other program of the image would), or the
    launcher in a container that did not add NET_RAW (the proxy's securityContext)."""
    launcher, plain = capable_launcher
    command = {"copy-without-capability": [str(plain), *CAPTURE],
               "the-interpreter-itself": [world_python, "-I", "-c", PROGRAM, *CAPTURE],
               "net-raw-not-added": [str(launcher), *CAPTURE]}[how]
    run = subprocess.run(command, cwd=workdir, env={}, capture_output=True, text=True, timeout=60,
                         preexec_fn=container_start(net_raw_added=how != "net-raw-not-added", no_new_privs=True))
    assert run.returncode == 1, run.stderr
    assert f"error: {NO_PRIVILEGE}" in run.stderr
    assert (NOTHING_TO_PASS_ON in run.stderr) == (how != "the-interpreter-itself")
