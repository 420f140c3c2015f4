"""Processes the Prometheus e2e tests run: quiver-broker and a Prometheus server, each on free
loopback ports in its own temp dir, stopped by the fixtures (and at interpreter exit)."""

from __future__ import annotations

import atexit
import json
import os
import pathlib
import shutil
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from quiver_e2e import free_port, wait_until

_LIVE: list[subprocess.Popen] = []


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


class Process:
    """A child process with its log in `log_path`; stop() sends SIGTERM, then SIGKILL."""

    def __init__(self, name: str, args: list[str], log_path: pathlib.Path):
        self.name = name
        self.log_path = log_path
        self.log = open(log_path, "ab")  # noqa: SIM115 - held open for the process lifetime, closed in stop()
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT)
        _LIVE.append(self.proc)

    def check_running(self) -> None:
        if self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}")

    def stop(self, timeout: float = 20) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()
        return self.proc.returncode

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


class Broker(Process):
    def __init__(self, binary: str, work_dir: pathlib.Path, cluster: str, extra_args: tuple[str, ...] = ()):
        self.port = free_port()
        self.http_port = free_port()
        data_dir = work_dir / "broker-data"
        data_dir.mkdir()
        super().__init__(
            "quiver-broker",
            [
                binary,
                "--data-dir",
                str(data_dir),
                "--listen",
                self.addr,
                "--http-listen",
                f"127.0.0.1:{self.http_port}",
                "--grpc-listen",
                "off",
                "--advertise",
                self.addr,
                "--broker-name",
                "broker-0",
                "--cluster",
                cluster,
                *extra_args,
            ],
            work_dir / "broker.log",
        )
        wait_until(self.ready, 30, "quiver-broker /readyz")

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def ready(self) -> bool:
        self.check_running()
        try:
            return http_get(f"http://127.0.0.1:{self.http_port}/readyz")[0] == 200
        except OSError:
            return False

    def metric(self, name: str, **labels: str) -> float | None:
        """Sum of the broker's own samples of `name` whose labels include `labels`; None if absent.
        Used only to synchronise the test; assertions go through Prometheus."""
        _, text = http_get(f"http://127.0.0.1:{self.http_port}/metrics")
        total = None
        for line in text.splitlines():
            if line.startswith((name + "{", name + " ")):
                series, value = line.rsplit(" ", 1)
                if all(f'{k}="{v}"' in series for k, v in labels.items()):
                    total = (total or 0) + float(value)
        return total


class Prometheus(Process):
    """Prometheus scraping the broker (job quiver-broker) or, with `operator_http_port`, an operator
    /metrics (job quiver-operator, labels honoured as the chart's ServiceMonitor does)."""

    def __init__(
        self,
        work_dir: pathlib.Path,
        rules_file: pathlib.Path,
        broker_http_port: int | None = None,
        operator_http_port: int | None = None,
    ):
        binary = shutil.which("prometheus")
        assert binary, "prometheus missing: apt-get install prometheus"
        self.port = free_port()
        jobs = []
        if broker_http_port is not None:
            jobs.append({"job_name": "quiver-broker", "static_configs": [{"targets": [f"127.0.0.1:{broker_http_port}"]}]})
        if operator_http_port is not None:
            jobs.append(
                {
                    "job_name": "quiver-operator",
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{operator_http_port}"]}],
                }
            )
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
            "rule_files": [str(rules_file)],
            "scrape_configs": jobs,
        }
        config_file = work_dir / "prometheus.yml"
        config_file.write_text(json.dumps(config))
        super().__init__(
            "prometheus",
            [
                binary,
                f"--config.file={config_file}",
                f"--storage.tsdb.path={work_dir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            work_dir / "prometheus.log",
        )
        wait_until(self.ready, 30, "prometheus /-/ready")

    def ready(self) -> bool:
        self.check_running()
        try:
            return http_get(f"http://127.0.0.1:{self.port}/-/ready")[0] == 200
        except OSError:
            return False

    def api(self, path: str, **params: str):
        query = urllib.parse.urlencode(params)
        status, body = http_get(f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}")
        payload = json.loads(body)
        assert status == 200 and payload["status"] == "success", (path, params, payload)
        return payload["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("query", query=promql)["result"]

    def alerts(self) -> list[dict]:
        return self.api("alerts")["alerts"]


@atexit.register
def _kill_leftovers() -> None:
    for proc in _LIVE:
        if proc.poll() is None:
            proc.kill()


def broker_binary() -> str:
    binary = os.environ.get("QUIVER_BROKER_BIN") or os.path.join(os.environ.get("QUIVER_BIN_DIR", ""), "quiver-broker")
    assert os.access(binary, os.X_OK), f"quiver-broker not found at {binary!r} (set QUIVER_BIN_DIR)"
    return binary
