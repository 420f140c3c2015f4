"""Fixtures: quiver-broker processes on free loopback ports, each in its own data directory."""

import atexit
import os
import signal
import subprocess
import tempfile
import urllib.request

import pytest
from quiver_e2e import free_port, wait_until

BROKER_BIN = os.environ.get("QUIVER_BROKER_BIN", "")
_LIVE = []


class Broker:
    """One quiver-broker process; restartable on the same ports and data directory."""

    def __init__(self, data_dir, name="broker-0", extra=None, port=None, http_port=None, peers=None):
        self.data_dir = data_dir
        self.name = name
        self.port = port or free_port()
        self.http_port = http_port or free_port()
        self.extra = list(extra or [])
        self.peers = list(peers or [])
        self.proc = None
        self.log_path = os.path.join(data_dir, f"{name}.log")

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def start(self):
        args = [
            BROKER_BIN,
            "--data-dir", self.data_dir,
            "--listen", self.addr,
            "--http-listen", f"127.0.0.1:{self.http_port}",
            "--grpc-listen", "off",
            "--advertise", self.addr,
            "--broker-name", self.name,
            "--persist-interval-ms", "200",
        ] + self.extra
        if self.peers:
            args += ["--peers", ",".join(self.peers)]
        log = open(self.log_path, "ab")
        env = dict(os.environ, RUST_LOG=os.environ.get("QUIVER_E2E_LOG", "info"))
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        _LIVE.append(self.proc)
        wait_until(self.ready, 30, f"{self.name} /readyz")
        return self

    def ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            return self.http("/readyz")[0] == 200
        except OSError:
            return False

    def http(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metric(self, name, **labels):
        """Sum of a metric's samples whose labels include `labels`; None when absent."""
        _, text = self.http("/metrics")
        total = None
        for line in text.splitlines():
            if not line.startswith(name + "{"):
                continue
            series, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total = (total or 0) + float(value)
        return total

    def stop(self, timeout=20):
        """SIGTERM, then require a clean exit 0 within `timeout`."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=timeout)
        return code

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def log_tail(self, lines=30):
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""


@atexit.register
def _kill_leftovers():
    for proc in _LIVE:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def data_dir():
    with tempfile.TemporaryDirectory(prefix="quiver-e2e-") as d:
        yield d


@pytest.fixture
def make_broker(data_dir):
    started = []

    def make(name="broker-0", extra=None, **kwargs):
        directory = os.path.join(data_dir, name)
        os.makedirs(directory, exist_ok=True)
        broker = Broker(directory, name=name, extra=extra, **kwargs)
        started.append(broker)
        return broker

    yield make
    for broker in started:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait(timeout=10)
        # Shown by pytest only when the test failed.
        print(f"---- {broker.name} log tail ----\n{broker.log_tail(400)}")
