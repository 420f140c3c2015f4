"""Fixtures: a quiver-broker process on free loopback ports and a runner for the `quiver` CLI."""

import atexit
import json
import os
import signal
import socket
import subprocess
import tempfile

import pytest
from quiver_e2e import free_port, wait_until

BIN_DIR = os.environ.get("QUIVER_BIN_DIR", "")
_LIVE = []


def _stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@atexit.register
def _stop_leftovers():
    for proc in _LIVE:
        _stop(proc)


class Broker:
    def __init__(self, data_dir, extra=()):
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.log_path = os.path.join(data_dir, "broker.log")
        args = [
            os.path.join(BIN_DIR, "quiver-broker"),
            "--data-dir", data_dir,
            "--listen", self.addr,
            "--http-listen", f"127.0.0.1:{free_port()}",
            "--grpc-listen", "off",
            "--advertise", self.addr,
            *extra,
        ]
        self.proc = subprocess.Popen(args, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT)
        _LIVE.append(self.proc)
        wait_until(self._accepts, 30, "the broker to accept connections")

    def _accepts(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"broker exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return True
        except OSError:
            return False

    def log_tail(self):
        with open(self.log_path, "rb") as f:
            return f.read()[-4000:].decode(errors="replace")

    def stop(self):
        _stop(self.proc)


class Quiver:
    """Runs the `quiver` CLI against one broker."""

    def __init__(self, server):
        self.server = server

    def run(self, *args, check=True, timeout=60, stdin=None):
        cmd = [os.path.join(BIN_DIR, "quiver"), "--server", self.server, *args]
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, input=stdin)
        if check and result.returncode != 0:
            raise AssertionError(f"{cmd} exited {result.returncode}\nstdout: {result.stdout}\nstderr: {result.stderr}")
        return result

    def create_topic(self, name, queues):
        return self.run("topics", "create", name, "--queues", str(queues))

    def json(self, *args, **kwargs):
        return json.loads(self.run("--output", "json", *args, **kwargs).stdout)

    def json_lines(self, *args, **kwargs):
        out = self.run("--output", "json", *args, **kwargs).stdout
        return [json.loads(line) for line in out.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def broker():
    with tempfile.TemporaryDirectory(prefix="quiver-interop-") as data_dir:
        b = Broker(data_dir)
        try:
            yield b
        finally:
            b.stop()


@pytest.fixture(scope="module")
def quiver(broker):
    return Quiver(broker.addr)
