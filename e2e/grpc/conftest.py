"""Fixtures: a quiver-broker process with its remoting, HTTP and gRPC ports on free loopback
ports, restartable (same ports, same data directory) for the kill -9 tests."""

import atexit
import json
import os
import signal
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request

import pytest
from quiver_e2e import free_port, wait_until

import remoting

BIN_DIR = os.environ.get("QUIVER_BIN_DIR", "")
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
_LIVE = []


@atexit.register
def _kill_leftovers():
    for proc in _LIVE:
        if proc.poll() is None:
            proc.kill()


def _accepts(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Broker:
    """One quiver-broker; `grpc_endpoint` is what 5.x clients are given, `addr` what 4.x ones are."""

    def __init__(self, data_dir, extra=()):
        self.data_dir = data_dir
        self.port, self.http_port, self.grpc_port = free_port(), free_port(), free_port()
        self.extra = list(extra)
        self.log_path = os.path.join(data_dir, "broker.log")
        self.proc = None

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_endpoint(self):
        return f"127.0.0.1:{self.grpc_port}"

    def start(self):
        args = [
            os.path.join(BIN_DIR, "quiver-broker"),
            "--data-dir", self.data_dir,
            "--listen", self.addr,
            "--advertise", self.addr,
            "--http-listen", f"127.0.0.1:{self.http_port}",
            "--grpc-listen", self.grpc_endpoint,
            "--grpc-advertise", self.grpc_endpoint,
            "--persist-interval-ms", "200",
            *self.extra,
        ]
        env = dict(os.environ, RUST_LOG=os.environ.get("QUIVER_E2E_LOG", "info"))
        self.proc = subprocess.Popen(args, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT, env=env)
        _LIVE.append(self.proc)
        wait_until(self._serving, 30, "the broker's /readyz and gRPC port")
        return self

    def _serving(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"broker exited with {self.proc.returncode}: {self.log_tail()}")
        return self.http("/readyz")[0] == 200 and _accepts(self.grpc_port)

    def http(self, path):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError:
            return None, ""

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
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(timeout=timeout)
        return self.proc.returncode if self.proc else 0

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def log_tail(self, lines=60):
        try:
            with open(self.log_path, "rb") as f:
                return b"".join(f.readlines()[-lines:]).decode(errors="replace")
        except OSError:
            return ""

    # Admin over the remoting port, as an operator would do it.

    def quiver(self, *args, timeout=60):
        cmd = [os.path.join(BIN_DIR, "quiver"), "--server", self.addr, "--output", "json", *args]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        assert done.returncode == 0, f"{cmd}: {done.stdout}\n{done.stderr}"
        return done.stdout

    def create_topic(self, topic, queues=4):
        self.quiver("topics", "create", topic, "--queues", str(queues))

    def create_group(self, group, fifo=False, retry_max_times=16):
        """A subscription group; `fifo` is consumeMessageOrderly, which 5.x clients learn as FIFO."""
        body = json.dumps({
            "groupName": group, "consumeEnable": True, "consumeMessageOrderly": fifo,
            "retryMaxTimes": retry_max_times, "retryQueueNums": 1,
        }).encode()
        code, remark, _, _ = remoting.call(self.addr, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
        assert code == 0, remark

    def from_earliest(self, group, topic):
        """A new group starts at offset 0 (4.x clients start a group without offsets at the end)."""
        self.quiver("offsets", "reset", "--group", group, "--topic", topic, "--to", "earliest")


@pytest.fixture
def broker_extra(request):
    """Extra broker flags; a test sets them with `parametrize(..., indirect=True)`."""
    return getattr(request, "param", [])


@pytest.fixture
def broker(broker_extra):
    with tempfile.TemporaryDirectory(prefix="quiver-grpc-e2e-") as data_dir:
        b = Broker(data_dir, extra=["--flush-mode", "sync", *broker_extra]).start()
        try:
            yield b
        finally:
            if b.proc.poll() is None:
                b.proc.kill()
                b.proc.wait(timeout=10)
            # Shown by pytest only when the test failed.
            print(f"---- broker log tail ----\n{b.log_tail(200)}")
