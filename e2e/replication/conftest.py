"""Fixtures of the replication suite: a replicated broker group of three quiver-broker
processes on free loopback ports (one broker name, --group-members), each restartable on the
same ports with the same (or a wiped) data directory, killable (-9), stoppable (SIGSTOP)."""

import atexit
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request

import pytest

import wire
from quiver_e2e import free_port, wait_until

BROKER_BIN = os.environ.get("QUIVER_BROKER_BIN", "")
BIN_DIR = os.environ.get("QUIVER_BIN_DIR", "")
BROKER_NAME = "group-a"
PROBE_TOPIC = "ProbeTopic"
SEGMENT_SIZE = 1024 * 1024
_LIVE = []


class Member:
    """One group member: a quiver-broker process with its own ports and data directory. Its log
    lives outside the data directory, so a disk loss (wipe) keeps it."""

    def __init__(self, work_dir, replica_id, port, http_port):
        self.id = replica_id
        self.port = port
        self.http_port = http_port
        self.data_dir = os.path.join(work_dir, f"member-{replica_id}")
        self.log_path = os.path.join(work_dir, f"member-{replica_id}.log")
        self.proc = None
        self.paused = False
        self.members_arg = None  # set by Group
        # {flag: value} replacing the value of a flag the suite passes (or added).
        self.overrides = {}

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def __repr__(self):
        return f"member-{self.id}({self.addr})"

    def start(self, wipe=False, extra=()):
        if wipe and os.path.exists(self.data_dir):
            shutil.rmtree(self.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        args = [
            BROKER_BIN,
            "--data-dir", self.data_dir,
            "--listen", self.addr,
            "--http-listen", f"127.0.0.1:{self.http_port}",
            "--grpc-listen", "off",
            "--advertise", self.addr,
            "--broker-name", BROKER_NAME,
            "--persist-interval-ms", "200",
            "--group-members", self.members_arg,
            "--replica-id", str(self.id),
            "--replication", "sync",
            "--min-in-sync-replicas", "2",
            "--master-timeout-ms", "1000",
            "--replica-lag-max-ms", "1000",
            "--replication-timeout-ms", "3000",
            "--segment-size", str(SEGMENT_SIZE),
            # At most half a segment (the default 4 MiB is refused with 1 MiB segments).
            "--max-message-size", str(SEGMENT_SIZE // 4),
        ] + list(extra)
        for flag, value in self.overrides.items():
            if flag in args:
                args[args.index(flag) + 1] = str(value)
            else:
                args += [flag, str(value)]
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== start {time.strftime('%H:%M:%S')} wipe={wipe} ====\n".encode())
            log.flush()
            env = dict(os.environ, RUST_LOG=os.environ.get("QUIVER_E2E_LOG", "info"))
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env)
        self.paused = False
        _LIVE.append(self.proc)
        wait_until(self.ready, 30, f"{self} /readyz")
        return self

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def ready(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"{self} exited with {self.proc.returncode}: {self.log_tail()}")
        try:
            return self.http("/readyz")[0] == 200
        except OSError:
            return False

    def http(self, path, timeout=2):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=timeout) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def metrics(self):
        """{(name, labels text): value} of /metrics; {} when it does not answer (dead, stopped)."""
        if not self.alive() or self.paused:
            return {}
        try:
            _, text = self.http("/metrics")
        except OSError:
            return {}
        out = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            name, _, labels = series.partition("{")
            try:
                out[(name, labels.rstrip("}"))] = float(value)
            except ValueError:
                pass
        return out

    def metric(self, name, metrics=None, **labels):
        total = None
        for (series, text), value in (metrics if metrics is not None else self.metrics()).items():
            if series == name and all(f'{k}="{v}"' in text for k, v in labels.items()):
                total = (total or 0) + value
        return total

    def view(self):
        """(role, epoch, in-sync count) from /metrics; role None when it does not answer."""
        m = self.metrics()
        if not m:
            return None, None, None
        role = None
        for r in ("master", "replica", "unknown"):
            if self.metric("quiver_replication_role", m, role=r) == 1:
                role = r
        epoch = self.metric("quiver_replication_epoch", m)
        in_sync = self.metric("quiver_replication_in_sync_replicas", m)
        return role, (int(epoch) if epoch is not None else None), (int(in_sync) if in_sync is not None else None)

    def kill9(self):
        if self.alive():
            if self.paused:
                self.proc.send_signal(signal.SIGCONT)
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.paused = False

    def stop(self, timeout=20):
        if not self.alive():
            return self.proc.returncode if self.proc else 0
        if self.paused:
            self.resume()
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=timeout)

    def pause(self):
        self.proc.send_signal(signal.SIGSTOP)
        self.paused = True

    def resume(self):
        self.proc.send_signal(signal.SIGCONT)
        self.paused = False

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines=40):
        return "\n".join(self.log_text().splitlines()[-lines:])


class Group:
    """The three members of broker name `group-a`."""

    def __init__(self, work_dir, size=3):
        ports = [free_port() for _ in range(size)]
        self.work_dir = work_dir
        self.members = [Member(work_dir, i, ports[i], free_port()) for i in range(size)]
        members_arg = ",".join(f"{m.id}=127.0.0.1:{m.port}" for m in self.members)
        for m in self.members:
            m.members_arg = members_arg
        self.probes = 0

    @property
    def namesrv(self):
        """Every member answers routes: all three are the clients' name servers."""
        return ";".join(m.addr for m in self.members)

    def start(self):
        for m in self.members:
            m.start()
        master = self.wait_master(timeout=30)
        wire.create_topic(master.addr, PROBE_TOPIC)
        self.wait_writable(timeout=30)
        self.wait_in_sync(len(self.members), timeout=60)
        return self

    def wait(self, predicate, timeout, what):
        """wait_until, failing with each member's (role, epoch, in-sync count) at the deadline."""
        try:
            return wait_until(predicate, timeout, what)
        except AssertionError as error:
            raise AssertionError(f"{error}; members (role, epoch, in sync) now: {self.views()}") from None

    def views(self):
        return {m.id: m.view() for m in self.members}

    def master(self, exclude=(), min_epoch=0):
        """The member that reports itself master of the highest epoch (at least `min_epoch`),
        among live, running members not in `exclude`; None when there is none."""
        best = None
        for m in self.members:
            if m.id in exclude or not m.alive() or m.paused:
                continue
            role, epoch, _ = m.view()
            if role == "master" and epoch is not None and epoch >= min_epoch:
                if best is None or epoch > best[1]:
                    best = (m, epoch)
        return best[0] if best else None

    def wait_master(self, exclude=(), min_epoch=0, timeout=30):
        return self.wait(lambda: self.master(exclude, min_epoch), timeout,
                         f"a master (epoch >= {min_epoch}, not {list(exclude)})")

    def probe(self, member):
        """A raw send to the probe topic: True when the member acknowledged it (SEND_OK)."""
        self.probes += 1
        try:
            code, _, _, _ = wire.send(member.addr, PROBE_TOPIC, f"probe-{self.probes}", "probe",
                                      timeout=5)
        except OSError:
            return False
        return code == wire.SUCCESS

    def wait_writable(self, exclude=(), min_epoch=0, timeout=30):
        """The master once a send to it is acknowledged."""
        def writable():
            m = self.master(exclude, min_epoch)
            return m if m is not None and self.probe(m) else None
        return self.wait(writable, timeout,
                         f"a writable master (epoch >= {min_epoch}, not {list(exclude)})")

    def wait_in_sync(self, count, timeout=60):
        def in_sync():
            m = self.master()
            return m if m is not None and m.view()[2] == count else None
        return self.wait(in_sync, timeout, f"{count} members in sync")

    def wait_rejoined(self, member, timeout=90):
        """`member` follows the current master's epoch as a replica and the master counts it
        in sync (its own status), with all members in sync."""
        def rejoined():
            master = self.master()
            if master is None:
                return None
            role, epoch, in_sync = master.view()
            if member.view()[:2] != ("replica", epoch) or in_sync != len(self.members):
                return None
            status = wire.status(master.addr)
            mine = [r for r in (status or {}).get("replicas", []) if r.get("replicaId") == member.id]
            return master if mine and mine[0].get("inSync") else None
        return self.wait(rejoined, timeout, f"{member} to rejoin in sync")

    def start_monitor(self, interval=0.2):
        """Samples every member's view in the background until stop_monitor: how often two
        members claimed to be master at once (of the same epoch: split brain; of different
        epochs: a deposed master that has not yet heard of its successor)."""
        self._monitor_stop = threading.Event()
        self.samples = 0
        self.same_epoch_masters = []  # (time, views)
        self.two_masters = 0
        self.longest_two_masters = 0.0
        def run():
            since = None
            while not self._monitor_stop.wait(interval):
                views = self.views()
                masters = [(i, v[1]) for i, v in views.items() if v[0] == "master"]
                self.samples += 1
                epochs = [e for _, e in masters]
                if len(epochs) != len(set(epochs)):
                    self.same_epoch_masters.append((time.strftime("%H:%M:%S"), views))
                if len(masters) > 1:
                    self.two_masters += 1
                    since = since or time.monotonic()
                    self.longest_two_masters = max(self.longest_two_masters, time.monotonic() - since)
                else:
                    since = None
        self._monitor = threading.Thread(target=run, daemon=True)
        self._monitor.start()

    def stop_monitor(self):
        self._monitor_stop.set()
        self._monitor.join(10)
        return (f"{self.samples} samples of the members' roles: {self.two_masters} with two "
                f"members claiming master (longest run {self.longest_two_masters:.1f} s), "
                f"{len(self.same_epoch_masters)} with two masters of the same epoch")

    def assert_no_panic(self):
        for m in self.members:
            text = m.log_text()
            assert "panicked" not in text, f"{m} panicked:\n" + "\n".join(
                line for line in text.splitlines() if "panicked" in line)


@atexit.register
def _kill_leftovers():
    for proc in _LIVE:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGCONT)
            except OSError:
                pass
            proc.kill()


@pytest.fixture
def work_dir(request):
    """The test's temp directory: members' data and logs, the producer's and consumer's
    records. Kept (and its path printed) when the test failed."""
    d = tempfile.mkdtemp(prefix="quiver-replication-")
    yield d
    call = getattr(request.node, "rep_call", None)
    if call is not None and call.passed:
        shutil.rmtree(d, ignore_errors=True)
    else:
        print(f"---- kept {d} (member logs member-N.log, producer-*.log, consumer-*.jsonl)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keeps each phase's report on the test item, so fixtures know whether the test failed."""
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture
def group(work_dir, request):
    g = Group(work_dir)
    yield g
    for m in g.members:
        if m.alive():
            if m.paused:
                m.resume()
            m.proc.kill()
            m.proc.wait(timeout=10)
    # The suite runs with -s: the members' logs only when the test failed.
    failed = getattr(request.node, "rep_call", None)
    if failed is None or failed.failed:
        for m in g.members:
            print(f"---- {m} log tail ----\n{m.log_tail(150)}")
