"""A real headless Chromium that can reach the kafka-census under test and nothing else.

Owns `offline_browser()`: a network namespace of its own (`ip netns add kcb-PID-N`) with its
loopback up and one veth pair to the root namespace (a /30 of 10.233.0.0/16: the root side is
`Browser.host`, the namespace side `Browser.ns_ip`) and no default route, so from inside the
namespace every address but those two and loopback is unreachable (ENETUNREACH at once, no DNS,
no proxy). Debian's chromedriver runs inside the namespace (`ip netns exec`), so the Chromium it
starts does too; Selenium drives it from here through `webdriver.Remote` at the namespace's
veth address, so Selenium Manager never runs and nothing downloads a browser or a driver.
The kafka-census under test runs in the root namespace listening on `Browser.host`
(`Browser.census(...)`), and the page is `Browser.url(census, "/")`.

What it witnesses: `assert_offline()` proves the denial from inside the namespace (public
addresses fail with ENETUNREACH, the census's address connects); `requested_urls()` is every
URL the page asked for (Chrome's performance log: CDP `Network.requestWillBeSent`);
`console_errors()` the browser console's errors (a CSP violation is one); `screenshot(name)`
saves a PNG under build/test-artifacts/browser/ (git-ignored) and returns its path.

Teardown always runs (the context manager's finally): the browser quits, chromedriver's process
group and anything left in the namespace are killed, the veth pair and the namespace are
deleted. Needs root (network namespaces), iproute2, and `chromium` + `chromium-driver`
(`make setup-system`). Imports nothing from the project but harness.census and harness.net;
imports neither pytest nor tests/.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from harness.census import Census
from harness.net import free_port, wait_for
from harness.process import pdeathsig_preexec, tail

__all__ = ["ARTIFACTS", "Browser", "BrowserCensus", "offline_browser", "require_browser"]

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
#: Screenshots and logs of the browser tests (git-ignored: build/ is).
ARTIFACTS = Path(__file__).resolve().parent.parent / "build" / "test-artifacts" / "browser"
#: The /30s of the veth pairs: away from the 10.231.7.0/30 of tests/capture/test_capture_real.py.
POOL = ipaddress.IPv4Network("10.233.0.0/16")
#: Public addresses the namespace must not reach (assert_offline).
PUBLIC = (("1.1.1.1", 80), ("8.8.8.8", 53), ("93.184.215.14", 443), ("2606:4700:4700::1111", 443))
#: Serialises the choice of a free /30 between processes (two test runs at once).
_LOCK = Path(tempfile.gettempdir()) / "kafka-census-browser.lock"
_NAME = re.compile(r"^kcb-(\d+)-(\d+)\b")
_counter = 0

#: Chromium's flags: headless as root (no sandbox: root has no user namespace sandbox here), a
#: fresh profile, and no background traffic of its own (component updates, sync, QUIC probes),
#: so that requested_urls() holds the page's requests and nothing else.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage", "--no-proxy-server", "--disable-extensions",
    "--window-size=1280,1000", "--lang=en-US",
)


def require_browser() -> None:
    """Fail with the command that installs what is missing (root, ip, chromium, chromedriver)."""
    missing = [pkg for path, pkg in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver"))
               if not os.access(path, os.X_OK)]
    if shutil.which("ip") is None:
        missing.append("iproute2")
    if missing:
        raise AssertionError(f"the browser tests need {', '.join(missing)}: run `make setup-system` "
                             f"(as root: apt-get install {' '.join(missing)})")
    if os.geteuid() != 0:
        raise AssertionError("the browser tests create a network namespace: run them as root")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=15)
    if check and proc.returncode != 0:
        raise AssertionError(f"ip {' '.join(args)}: {proc.stderr.strip()} (needs root and iproute2)")
    return proc


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep_stale() -> None:
    """Delete the namespaces (and veth pairs) of earlier runs whose process is gone (killed
    before its teardown ran): this module's names only, kcb-PID-N."""
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        found = _NAME.match(line)
        if found and not _pid_alive(int(found.group(1))):
            pid, n = found.groups()
            _ip("link", "del", _host_if(int(pid), int(n)), check=False)
            _ip("netns", "del", found.group(0), check=False)


def _host_if(pid: int, n: int) -> str:
    return f"kcbh{pid % 1000000}n{n % 100}"  # at most 15 characters (IFNAMSIZ)


def _free_subnet() -> ipaddress.IPv4Network:
    """A /30 of POOL none of whose addresses the root namespace has."""
    used = set()
    for addr in re.findall(r"inet (\d+\.\d+\.\d+\.\d+)", _ip("-4", "-o", "addr", "show").stdout):
        used.add(ipaddress.ip_address(addr))
    subnets: list[ipaddress.IPv4Network] = list(POOL.subnets(new_prefix=30))
    start = (os.getpid() * 7) % len(subnets)
    for i in range(len(subnets)):
        net = subnets[(start + i) % len(subnets)]
        if not used & set(net):
            return net
    raise AssertionError(f"no free /30 left in {POOL}")


class BrowserCensus(Census):
    """`Census` listening on the root side of the veth pair (`host`) instead of 127.0.0.1, so
    that the browser in the namespace can reach it; reading it from here works the same way."""

    def __init__(self, args: list[str], host: str, http_port: int | None = None, **kwargs) -> None:
        self.host = host
        port = http_port if http_port is not None else free_port(host)
        super().__init__([*args, "--http", f"{host}:{port}"], port, http_flag=False, **kwargs)

    # Census.__init__ assigns base and target for 127.0.0.1: these win, whatever it assigns.
    @property
    def base(self) -> str:
        return f"http://{self.host}:{self.http_port}"

    @base.setter
    def base(self, _value: str) -> None:
        pass

    @property
    def target(self) -> str:
        return f"{self.host}:{self.http_port}"

    @target.setter
    def target(self, _value: str) -> None:
        pass


class Browser:
    """One Chromium session in its own namespace (see the module docstring)."""

    def __init__(self, netns: str, subnet: ipaddress.IPv4Network, host: str, ns_ip: str, driver,
                 log_dir: Path) -> None:
        self.netns, self.subnet, self.host, self.ns_ip = netns, subnet, host, ns_ip
        self.driver = driver
        self.log_dir = log_dir
        self._requests: list[dict] = []
        self._console: list[dict] = []

    # --- the census under test ---------------------------------------------------------------

    def census(self, args: list[str], **kwargs) -> BrowserCensus:
        """`kafka-census *args` listening on `host` (a free port), ready (see Census)."""
        return BrowserCensus(args, self.host, **kwargs)

    def url(self, census: Census, path: str = "/") -> str:
        return census.base + path

    def get(self, url: str) -> None:
        """Load `url`; what earlier pages requested and logged is forgotten first."""
        self.reset()
        self.driver.get(url)

    # --- witnesses ----------------------------------------------------------------------------

    def _drain(self) -> None:
        for entry in self._log("performance"):
            message = json.loads(entry["message"])["message"]
            if message.get("method") == "Network.requestWillBeSent":
                request = message["params"]["request"]
                self._requests.append({"url": request["url"], "method": request.get("method"),
                                       "headers": request.get("headers", {})})
        self._console.extend(self._log("browser"))

    def _log(self, kind: str) -> list[dict]:
        """Chromedriver's log of `kind` since the last read (webdriver.Remote has no get_log)."""
        return self.driver.execute("getLog", {"type": kind})["value"]

    def reset(self) -> None:
        """Forget what was requested and logged so far."""
        self._drain()
        self._requests.clear()
        self._console.clear()

    def requested_urls(self) -> list[str]:
        """Every URL requested since the last get()/reset(), in order (data: URLs included)."""
        return [r["url"] for r in self.sent_requests()]

    def sent_requests(self) -> list[dict]:
        """Every request since the last get()/reset(), in order: {url, method, headers} as the
        page made it (headers its script set, such as Authorization, included)."""
        self._drain()
        return [dict(r) for r in self._requests]

    def foreign_requests(self, census: Census) -> list[str]:
        """The requested URLs that are neither `census`'s origin nor data: URLs (no request
        left the page for anywhere else)."""
        return [u for u in self.requested_urls() if not (u.startswith(census.base + "/") or u.startswith("data:"))]

    def console(self) -> list[dict]:
        """The browser console's entries since the last get()/reset() ({level, message, ...})."""
        self._drain()
        return list(self._console)

    def console_errors(self) -> list[str]:
        """The console's errors (SEVERE): a failed load, an uncaught exception, a CSP violation."""
        return [e["message"] for e in self.console() if e.get("level") == "SEVERE"]

    def screenshot(self, name: str) -> Path:
        """Save the viewport as ARTIFACTS/NAME.png, print and return its path."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        assert self.driver.save_screenshot(str(path)), f"screenshot {path} failed"
        print(f"screenshot: {path}")
        return path

    def wait(self, what: str, check, timeout: float = 20.0):
        """harness.net.wait_for, for conditions on the page."""
        return wait_for(what, check, timeout, interval=0.05)

    def assert_offline(self, reachable: tuple[str, int] | None = None) -> dict[str, str]:
        """From inside the namespace: every PUBLIC address (IPv4 and IPv6) and every address of
        this machine but the veth pair's fails at once with ENETUNREACH (no route: nothing waits
        for a timeout), its only IPv4 route is the /30, and `reachable` (the census's host and
        port), if given, connects, so the denial is not a dead namespace. Returns
        {address: outcome}."""
        own = [a for a in re.findall(r"inet6? ([0-9a-f.:]+)/\d+ (?:brd \S+ )?scope global",
                                     _ip("-o", "addr", "show").stdout) if a != self.host]
        denied = [*PUBLIC, *((a, 80) for a in own)]
        targets = [*denied, *([reachable] if reachable else [])]
        probe = ("import json, socket, sys\n"
                 "out = {}\n"
                 "for host, port in json.loads(sys.argv[1]):\n"
                 "    s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET); s.settimeout(5)\n"
                 "    try:\n"
                 "        s.connect((host, port)); out[f'{host}:{port}'] = 'connected'\n"
                 "    except OSError as exc:\n"
                 "        out[f'{host}:{port}'] = f'errno {exc.errno}'\n"
                 "    finally:\n"
                 "        s.close()\n"
                 "print(json.dumps(out))\n")
        proc = subprocess.run(["ip", "netns", "exec", self.netns, sys.executable, "-I", "-c", probe,
                               json.dumps(targets)], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, f"the probe in {self.netns} failed: {proc.stderr}"
        outcome = json.loads(proc.stdout)
        for host, port in denied:
            key = f"{host}:{port}"
            assert outcome[key] == f"errno {errno.ENETUNREACH}", \
                f"{key} from inside {self.netns}: {outcome[key]}, expected ENETUNREACH"
        routes = _ip("netns", "exec", self.netns, "ip", "-4", "route", "show").stdout.splitlines()
        assert len(routes) == 1 and routes[0].startswith(f"{self.subnet} "), routes
        if reachable:
            key = f"{reachable[0]}:{reachable[1]}"
            assert outcome[key] == "connected", f"{key} from inside {self.netns}: {outcome[key]}"
        return outcome

    @contextlib.contextmanager
    def artifacts_on_failure(self, name: str) -> Iterator[None]:
        """On an exception in the block: save a screenshot, the page's HTML and its console
        (ARTIFACTS/NAME-failed.*, paths printed), then let the exception go on."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                self.screenshot(f"{name}-failed")
                page = ARTIFACTS / f"{name}-failed.html"
                page.write_text(self.driver.page_source)
                console = ARTIFACTS / f"{name}-failed.console.json"
                console.write_text(json.dumps({"console": self.console(), "requests": self.sent_requests()},
                                              indent=1))
                print(f"page: {page}\nconsole and requests: {console}")
            raise


@contextlib.contextmanager
def offline_browser(window: tuple[int, int] = (1280, 1000)) -> Iterator[Browser]:
    """A Browser in a fresh namespace; everything it made is undone on exit, failure or not."""
    global _counter
    require_browser()
    from selenium import webdriver  # here: the fast tier never needs selenium imported
    from selenium.webdriver.chromium.remote_connection import ChromiumRemoteConnection
    from selenium.webdriver.common.proxy import Proxy, ProxyType
    from selenium.webdriver.remote.client_config import ClientConfig

    _counter += 1
    pid, n = os.getpid(), _counter
    netns, host_if, ns_if = f"kcb-{pid}-{n}", _host_if(pid, n), f"kcbn{pid % 1000000}n{n % 100}"
    log_dir = Path(tempfile.mkdtemp(prefix="kafka-census-browser-"))
    driver_proc: subprocess.Popen | None = None
    driver = None
    created = False
    try:
        with open(_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the choice of a /30 and its assignment, atomically
            _sweep_stale()
            subnet = _free_subnet()
            host, ns_ip = (str(a) for a in list(subnet.hosts())[:2])
            _ip("netns", "add", netns)
            created = True
            _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            _ip("link", "set", ns_if, "netns", netns)
            _ip("addr", "add", f"{host}/30", "dev", host_if)
            _ip("link", "set", host_if, "up")
        _ip("netns", "exec", netns, "ip", "link", "set", "lo", "up")
        _ip("netns", "exec", netns, "ip", "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("netns", "exec", netns, "ip", "link", "set", ns_if, "up")
        # No default route: only 127.0.0.0/8 and the /30 are routable from inside.
        routes = _ip("netns", "exec", netns, "ip", "-4", "route", "show").stdout
        assert "default" not in routes, f"{netns} has a default route: {routes}"

        port = 9515  # the namespace is empty: any port is free there
        driver_log = log_dir / "chromedriver.log"
        with open(driver_log, "wb") as out:
            driver_proc = subprocess.Popen(
                ["ip", "netns", "exec", netns, CHROMEDRIVER, f"--port={port}", f"--allowed-ips={host}",
                 "--allowed-origins=*", f"--log-path={driver_log}"],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, preexec_fn=pdeathsig_preexec())
        remote = f"http://{ns_ip}:{port}"

        def driver_up() -> bool:
            assert driver_proc.poll() is None, f"chromedriver exited {driver_proc.returncode}: {tail(driver_log)}"
            try:
                with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(remote + "/status",
                                                                                       timeout=2) as resp:
                    return json.load(resp)["value"]["ready"]
            except (OSError, ValueError, KeyError):
                return False
        wait_for(f"chromedriver in {netns} at {remote}", driver_up, 20)

        options = webdriver.ChromeOptions()
        options.binary_location = CHROMIUM
        for flag in CHROMIUM_FLAGS:
            if not flag.startswith("--window-size="):
                options.add_argument(flag)
        options.add_argument(f"--window-size={window[0]},{window[1]}")
        options.add_argument(f"--user-data-dir={log_dir / 'profile'}")
        options.set_capability("goog:loggingPrefs", {"performance": "ALL", "browser": "ALL"})
        config = ClientConfig(remote, proxy=Proxy({"proxyType": ProxyType.DIRECT}), timeout=60)
        # Chromium's command set (getLog, executeCdpCommand), straight to the namespace: no proxy.
        executor = ChromiumRemoteConnection(remote, vendor_prefix="goog", browser_name="chrome",
                                            ignore_proxy=True, client_config=config)
        driver = webdriver.Remote(command_executor=executor, options=options)
        yield Browser(netns, subnet, host, ns_ip, driver, log_dir)
    finally:
        if driver is not None:
            with contextlib.suppress(Exception):
                driver.quit()
        if driver_proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(driver_proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                driver_proc.wait(10)
        if created:
            # Whatever is still in the namespace was started here (chromium's children).
            for pid_text in _ip("netns", "pids", netns, check=False).stdout.split():
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(pid_text), signal.SIGKILL)
            _ip("link", "del", host_if, check=False)
            _ip("netns", "del", netns, check=False)
        shutil.rmtree(log_dir, ignore_errors=True)
