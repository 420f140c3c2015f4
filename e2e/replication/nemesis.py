"""The nemesis harness: a replicated group whose members live in network namespaces of their own
(netns.py), a workload that runs throughout (raw-frame producers with several sends in flight,
the stock producer, the stock push consumer), an observer of roles, epochs and the consensus
leader, readers that PULL every member from offset 0 after each fault, the faults themselves,
and the run that ends with the checker (nemesis_checker.py).

Everything is bounded: every wait has a deadline, runs last a given number of seconds, and the
seed of the random schedule is printed (QUIVER_NEMESIS_SEED sets it).
"""

import ctypes
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import remoting
import wire
from conftest import BROKER_BIN, BROKER_NAME, PROBE_TOPIC, SEGMENT_SIZE, _LIVE, Group, Member
from nemesis_checker import AckRec, Delivery, Served, check_run, loss_windows
from quiver_e2e import wait_until
from workload import ProducerDriver

HERE = os.path.dirname(os.path.abspath(__file__))
TOPIC = "NemesisTopic"
CONSUMER_GROUP = "NemesisConsumers"
QUEUES = 4
QUERY_CONSUMER_OFFSET = 14
LAG_MAX_MS = 1000
MASTER_TIMEOUT_MS = 1000
CONSENSUS_GAUGE = "quiver_replication_consensus_leader"
VOTE_RE = re.compile(r"vote is changing from \S+ to T(\d+)-N(\d+):committed")


def now():
    return time.monotonic()


_libc = ctypes.CDLL(None, use_errno=True)


def die_with_parent():
    """In a child before exec: SIGKILL it when the test process dies, even by SIGKILL (members
    and the consumer never outlive the run). Children are started from the main thread only
    (the signal follows the thread that started them)."""
    _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Timeline:
    """What happened when (monotonic seconds and wall clock), printed as it goes and in every
    failure message."""

    def __init__(self):
        self.t0 = now()
        self.entries = []
        self.lock = threading.Lock()

    def add(self, text):
        t = now()
        line = f"[{time.strftime('%H:%M:%S')} +{t - self.t0:7.2f}s] {text}"
        with self.lock:
            self.entries.append((t, line))
        print("\n" + line, flush=True)
        return t

    def text(self, last=None):
        with self.lock:
            lines = [line for _, line in self.entries]
        return "\n".join(lines[-last:] if last else lines)


# ---- members in namespaces ------------------------------------------------------------------

class NsMember(Member):
    """A group member in its own network namespace: remoting on ADDR:10911, HTTP on ADDR:8080.
    The test talks to its HTTP port from inside the namespace (never cut)."""

    def __init__(self, work_dir, replica_id, net, mode, flags):
        super().__init__(work_dir, replica_id, 10911, 8080)
        self.net = net
        self.mode = mode
        self.flags = flags

    @property
    def host(self):
        return self.net.addr(self.id)

    @property
    def addr(self):
        return f"{self.host}:{self.port}"

    def start(self, wipe=False, extra=()):
        if wipe and os.path.exists(self.data_dir):
            shutil.rmtree(self.data_dir)
        os.makedirs(self.data_dir, exist_ok=True)
        args = self.net.exec_prefix(self.id) + [
            BROKER_BIN,
            "--data-dir", self.data_dir,
            "--listen", self.addr,
            "--advertise", self.addr,
            "--http-listen", f"{self.host}:{self.http_port}",
            "--grpc-listen", "off",
            "--broker-name", BROKER_NAME,
            "--persist-interval-ms", "200",
            "--group-members", self.members_arg,
            "--replica-id", str(self.id),
            "--replication", self.mode,
            "--min-in-sync-replicas", "2",
            "--master-timeout-ms", str(self.flags["master_timeout_ms"]),
            "--replica-lag-max-ms", str(self.flags["lag_max_ms"]),
            "--replication-timeout-ms", "3000",
            "--segment-size", str(SEGMENT_SIZE),
            "--max-message-size", str(SEGMENT_SIZE // 4),
        ] + list(extra)
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== start {time.strftime('%H:%M:%S')} wipe={wipe} ====\n".encode())
            log.flush()
            env = dict(os.environ, RUST_LOG=os.environ.get("QUIVER_E2E_LOG", "info"))
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=die_with_parent)
        self.paused = False
        _LIVE.append(self.proc)
        wait_until(self.ready, 60, f"{self} /readyz")
        return self

    def http(self, path, timeout=2):
        with self.net.inside(self.id):
            try:
                with urllib.request.urlopen(f"http://{self.host}:{self.http_port}{path}",
                                            timeout=timeout) as r:
                    return r.status, r.read().decode()
            except urllib.error.HTTPError as e:
                return e.code, e.read().decode()

    def consensus_gauge(self):
        """1/0 of quiver_replication_consensus_leader; None when it does not answer or the
        binary has no such gauge."""
        value = self.metric(CONSENSUS_GAUGE)
        return None if value is None else int(value)


class NsGroup(Group):
    def __init__(self, work_dir, net, mode="sync", lag_max_ms=LAG_MAX_MS,
                 master_timeout_ms=MASTER_TIMEOUT_MS):
        self.work_dir = work_dir
        self.net = net
        self.mode = mode
        self.flags = {"lag_max_ms": lag_max_ms, "master_timeout_ms": master_timeout_ms}
        self.members = [NsMember(work_dir, i, net, mode, self.flags) for i in range(net.size)]
        members_arg = ",".join(f"{m.id}={m.addr}" for m in self.members)
        for m in self.members:
            m.members_arg = members_arg
        self.probes = 0

    def start(self):
        for m in self.members:
            m.start()
        master = self.wait_master(timeout=60)
        wire.create_topic(master.addr, PROBE_TOPIC)
        self.wait_writable(timeout=60)
        self.wait_in_sync(len(self.members), timeout=90)
        return self

    def by_id(self, i):
        return self.members[i]

    def consensus_leader(self, wait=10):
        """The member whose quiver_replication_consensus_leader gauge is 1 (waiting up to `wait`
        s for one). Fails when the binary has no such gauge: without it the nemesis cannot aim
        at the consensus leader."""
        deadline = now() + wait
        seen_gauge = False
        while True:
            leaders = []
            for m in self.members:
                if not m.alive() or m.paused:
                    continue
                g = m.consensus_gauge()
                if g is not None:
                    seen_gauge = True
                    if g == 1:
                        leaders.append(m)
            if len(leaders) == 1:
                return leaders[0]
            if now() > deadline or not seen_gauge:
                break
            time.sleep(0.2)
        if not seen_gauge:
            from_logs = self.consensus_leader_from_logs()
            if from_logs is not None:
                return from_logs
            raise AssertionError(
                f"no member exposes {CONSENSUS_GAUGE} on /metrics: this binary cannot say which "
                f"member leads consensus, so the consensus-leader faults cannot be aimed "
                f"(members' views: {self.views()})")
        raise AssertionError(f"no single consensus leader within {wait} s (gauge 1 on "
                             f"{[m.id for m in leaders]}; views {self.views()})")

    def consensus_leader_from_logs(self):
        """Fallback while the binary has no consensus gauge: the member named by the committed
        openraft vote of the highest term in the members' logs ("vote is changing from ... to
        T<term>-N<id>:committed", logged at info by every member that learns it)."""
        best = None
        for m in self.members:
            for match in VOTE_RE.finditer(m.log_text()):
                term, node = int(match.group(1)), int(match.group(2))
                if best is None or term > best[0]:
                    best = (term, node)
        if best is None:
            return None
        leader = self.members[best[1]]
        return leader if leader.alive() and not leader.paused else None

    def reachable_master(self, exclude=(), min_epoch=0):
        return self.master(exclude, min_epoch)


# ---- raw frames ------------------------------------------------------------------------------

def encode(code, ext, body, opaque):
    header = json.dumps({"code": code, "language": "PYTHON", "version": 0, "opaque": opaque,
                         "flag": 0, "remark": "",
                         "extFields": {k: str(v) for k, v in ext.items()}}).encode()
    return struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body


class FrameReader:
    """Frames off a socket with a timeout, without losing a frame cut by the timeout."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""

    def next(self):
        """(header, body), or None when nothing complete arrived before the socket's timeout."""
        while True:
            if len(self.buf) >= 4:
                total, = struct.unpack(">i", self.buf[:4])
                if len(self.buf) >= 4 + total:
                    frame = self.buf[4:4 + total]
                    self.buf = self.buf[4 + total:]
                    header_len = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
                    return json.loads(frame[4:4 + header_len]), frame[4 + header_len:]
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return None
            if not chunk:
                raise ConnectionError("closed by the broker")
            self.buf += chunk


def route_master(addrs, topic, timeout=2):
    """The master's address as the first member that answers a route request names it."""
    for addr in addrs:
        try:
            code, _, _, body = remoting.call(addr, remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": topic},
                                             timeout=timeout)
        except (OSError, ValueError):
            continue
        if code != 0:
            continue
        try:
            for broker in json.loads(body).get("brokerDatas", []):
                master = broker.get("brokerAddrs", {}).get("0")
                if master:
                    return master
        except ValueError:
            continue
    return None


class Recorder:
    """Every producer's tries and outcomes (thread-safe)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.acks = []  # AckRec
        self.sent = set()
        self.not_ok = {}  # code/remark kind -> count
        self.unknown = 0  # in flight when a connection died

    def tried(self, key):
        with self.lock:
            self.sent.add(key)

    def acked(self, rec):
        with self.lock:
            self.acks.append(rec)

    def refused(self, kind):
        with self.lock:
            self.not_ok[kind] = self.not_ok.get(kind, 0) + 1

    def count(self):
        with self.lock:
            return len(self.acks)


class RawProducer(threading.Thread):
    """A producer over raw remoting frames: up to `inflight` sends in flight on one connection to
    the master (found from a route answer), at most `rate` a second. Every send has a new key
    (NAME-SEQ): a retry is a new message. Any answer other than SEND_OK, a connection error or
    an answer not back within 10 s ends the connection (what was in flight is not acknowledged)
    and the producer looks the master up again."""

    def __init__(self, name, addrs, recorder, inflight=4, rate=40.0):
        super().__init__(daemon=True, name=name)
        self.pname = name
        self.addrs = list(addrs)
        self.recorder = recorder
        self.inflight = inflight
        self.rate = rate
        self.stopping = threading.Event()
        self.seq = 0
        self.sessions = 0
        self.error = None

    def stop(self):
        self.stopping.set()

    def run(self):
        try:
            rot = 0
            while not self.stopping.is_set():
                rot += 1
                addrs = self.addrs[rot % len(self.addrs):] + self.addrs[:rot % len(self.addrs)]
                master = route_master(addrs, TOPIC)
                if master is None:
                    self.stopping.wait(0.2)
                    continue
                self.sessions += 1
                self._session(master)
                self.stopping.wait(0.1)
        except Exception as error:  # reported by the run
            self.error = f"{type(error).__name__}: {error}"

    def _session(self, addr):
        host, port = addr.rsplit(":", 1)
        try:
            sock = socket.create_connection((host, int(port)), timeout=3)
        except OSError:
            return
        sock.settimeout(0.5)
        reader = FrameReader(sock)
        pending = {}  # opaque -> (key, queue, sent_at)
        lock = threading.Lock()
        window = threading.Semaphore(self.inflight)
        dead = threading.Event()

        def read_loop():
            try:
                while not dead.is_set():
                    got = reader.next()
                    if got is None:
                        with lock:
                            oldest = min((p[2] for p in pending.values()), default=None)
                        if oldest is not None and now() - oldest > 10:
                            return
                        if self.stopping.is_set() and oldest is None:
                            return
                        continue
                    header, _ = got
                    with lock:
                        entry = pending.pop(header.get("opaque"), None)
                    if entry is None:
                        continue
                    window.release()
                    key, queue, sent_at = entry
                    code = header.get("code")
                    ext = header.get("extFields") or {}
                    if code == wire.SUCCESS:
                        self.recorder.acked(AckRec(key, int(ext.get("queueId", queue)),
                                                   int(ext.get("queueOffset", -1)), sent_at,
                                                   now(), self.pname))
                    else:
                        remark = (header.get("remark") or "").split(",")[0][:60]
                        self.recorder.refused(f"{code} {remark}")
                        return
            except (OSError, ValueError):
                return
            finally:
                dead.set()

        t = threading.Thread(target=read_loop, daemon=True)
        t.start()
        opaque = 0
        interval = 1.0 / self.rate
        next_at = now()
        burst = 0
        try:
            while not dead.is_set() and not self.stopping.is_set():
                if not window.acquire(timeout=0.5):
                    continue
                # Bursts of `inflight` sends back to back, so that several are in flight at
                # once, at `rate` a second on average.
                if burst == 0:
                    wait = next_at - now()
                    if wait > 0:
                        time.sleep(wait)
                    next_at = max(next_at + interval * self.inflight, now() - 1.0)
                burst = (burst + 1) % self.inflight
                key = f"{self.pname}-{self.seq}"
                queue = self.seq % QUEUES
                self.seq += 1
                opaque += 1
                ext = {"producerGroup": f"nemesis-{self.pname}", "topic": TOPIC,
                       "defaultTopic": "TBW102", "defaultTopicQueueNums": QUEUES,
                       "queueId": queue, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000),
                       "flag": 0, "properties": f"KEYS\x01{key}\x02", "reconsumeTimes": 0,
                       "unitMode": "false", "batch": "false"}
                self.recorder.tried(key)
                with lock:
                    pending[opaque] = (key, queue, now())
                sock.sendall(encode(wire.SEND_MESSAGE, ext, f"body-{key}".encode(), opaque))
        except OSError:
            pass
        finally:
            dead.set()
            t.join(15)
            with lock:
                self.recorder.unknown += len(pending)
            sock.close()


class StockProducer(ProducerDriver):
    """The stock client (producer_main.py generations), but a retry after a failed send takes a
    NEW key (the next number after the highest tried), so it lands somewhere else."""

    def _run(self):
        try:
            with open(self.stderr_path, "ab") as err:
                while not self._stopping.is_set():
                    sent = self.history().sent
                    first = max((int(k[2:]) for k in sent), default=-1) + 1
                    self.generations += 1
                    self.proc = subprocess.Popen(
                        [sys.executable, os.path.join(HERE, "producer_main.py"), self.namesrv,
                         self.topic, str(self.queues), str(first), self.out_path, self.stop_file,
                         str(self.rate)],
                        stdout=err, stderr=subprocess.STDOUT)
                    self.proc.wait()
                    if self.proc.returncode == 0:
                        return
                    self._stopping.wait(0.2)
        except Exception as error:
            self.error = error

    def records(self):
        h = self.history()
        return ([AckRec(a.key, a.queue, a.offset, s, t, "stock")
                 for a, s, t in zip(h.acks, h.ack_started, h.ack_times)], h.sent, h)


class Consumer:
    """nemesis_consumer_main.py: the stock push consumer with one consume thread."""

    def __init__(self, namesrv, work_dir, name="c0"):
        self.name = name
        self.out_path = os.path.join(work_dir, f"consumer-{name}.jsonl")
        self.log_path = self.out_path + ".log"
        open(self.out_path, "w").close()
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "nemesis_consumer_main.py"), namesrv,
                 CONSUMER_GROUP, TOPIC, self.out_path], stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent)

    def deliveries(self):
        out = []
        with open(self.out_path, encoding="utf-8") as f:
            for line in f:
                if not line.endswith("\n"):
                    break
                key, queue, offset, _, t = json.loads(line)
                out.append(Delivery(t, self.name, queue, offset, key))
        return out

    def exited(self):
        if self.proc.poll() is None:
            return None
        with open(self.log_path, errors="replace") as log:
            return f"the consumer process exited with {self.proc.returncode}: {log.read()[-2000:]}"

    def shutdown(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class ServedLog:
    """Every (queue, offset, key) any reader saw, with up to 3 (source, time) per triple."""

    def __init__(self):
        self.lock = threading.Lock()
        self.seen = {}  # (queue, offset, key) -> [(source, t)]

    def add(self, source, t, rows):
        with self.lock:
            for q, o, k in rows:
                got = self.seen.setdefault((q, o, k), [])
                if len(got) < 3:
                    got.append((source, t))

    def served(self):
        with self.lock:
            return [Served(t, s, q, o, k) for (q, o, k), v in self.seen.items() for s, t in v]

    def conflicts_now(self):
        """(queue, offset) served with two keys so far."""
        with self.lock:
            keys = {}
            for q, o, k in self.seen:
                keys.setdefault((q, o), set()).add(k)
        return {pos: ks for pos, ks in keys.items() if len(ks) > 1}


class Observer(threading.Thread):
    """Samples every member's (role, epoch, in-sync count, consensus gauge) four times a
    second, and the consumer group's committed offsets on the master once a second."""

    def __init__(self, group, timeline, interval=0.25):
        super().__init__(daemon=True, name="observer")
        self.group = group
        self.timeline = timeline
        self.interval = interval
        self.stopping = threading.Event()
        self.samples = []  # (t, {id: (role, epoch, in_sync, consensus)})
        self.epochs = {}  # epoch -> (first seen t, master id)
        self.same_epoch_masters = []
        self.commits = []  # (t, queue, committed)
        self.error = None

    def stop(self):
        self.stopping.set()
        self.join(20)

    def run(self):
        last_commit = 0.0
        try:
            while not self.stopping.wait(self.interval):
                t = now()
                views = {}
                for m in self.group.members:
                    metrics = m.metrics()
                    if not metrics:
                        views[m.id] = (None, None, None, None)
                        continue
                    role = None
                    for r in ("master", "replica", "unknown"):
                        if m.metric("quiver_replication_role", metrics, role=r) == 1:
                            role = r
                    epoch = m.metric("quiver_replication_epoch", metrics)
                    in_sync = m.metric("quiver_replication_in_sync_replicas", metrics)
                    gauge = m.metric(CONSENSUS_GAUGE, metrics)
                    views[m.id] = (role, None if epoch is None else int(epoch),
                                   None if in_sync is None else int(in_sync),
                                   None if gauge is None else int(gauge))
                self.samples.append((t, views))
                masters = [(i, v[1]) for i, v in views.items() if v[0] == "master"]
                for i, epoch in masters:
                    if epoch not in self.epochs:
                        self.epochs[epoch] = (t, i)
                        self.timeline.add(f"observer: member-{i} is master of epoch {epoch} "
                                          f"(first seen); views {views}")
                epochs = [e for _, e in masters]
                if len(epochs) != len(set(epochs)):
                    self.same_epoch_masters.append((round(t, 3), views))
                if t - last_commit >= 1.0 and masters:
                    last_commit = t
                    i = max(masters, key=lambda x: x[1])[0]
                    self.sample_commits(self.group.by_id(i))
        except Exception as error:
            self.error = f"{type(error).__name__}: {error}"

    def sample_commits(self, member):
        """The group's committed offsets on `member`, each stamped with the time its answer
        arrived (the commit it shows happened before then)."""
        got = {}
        try:
            with member.net.inside(member.id):
                for q in range(QUEUES):
                    code, _, ext, _ = remoting.call(member.addr, QUERY_CONSUMER_OFFSET, {
                        "consumerGroup": CONSUMER_GROUP, "topic": TOPIC, "queueId": q},
                        timeout=2)
                    if code == 0 and "offset" in ext:
                        got[q] = int(ext["offset"])
                        self.commits.append((now(), q, got[q]))
        except OSError:
            pass
        return got

    def committed_on(self, member):
        """{queue: committed offset} of the group on `member` now (also recorded)."""
        return self.sample_commits(member)

    def master_epochs_of(self, member_id, since, until):
        """Epochs first seen in [since, until] whose master was `member_id`."""
        return [(e, round(t, 3)) for e, (t, i) in self.epochs.items()
                if i == member_id and since <= t <= until]


def read_member(member, timeout_s=60):
    """What the member serves of TOPIC from offset 0 (raw PULL through its own namespace, so a
    partition does not hide it): [(queue, offset, key)]."""
    rows = []
    with member.net.inside(member.id):
        for q in range(QUEUES):
            for r in wire.read_queue(member.addr, TOPIC, q, timeout=timeout_s / 6):
                rows.append((r["queue"], r["offset"], r["key"]))
    return rows


# ---- the run ---------------------------------------------------------------------------------

class Run:
    """One nemesis run: a group, the workload, the observer, the faults, and the final check."""

    def __init__(self, group, work_dir, seed, timeline=None):
        self.group = group
        self.net = group.net
        self.work_dir = work_dir
        self.seed = seed
        self.rng = random.Random(seed)
        self.timeline = timeline or Timeline()
        self.recorder = Recorder()
        self.served = ServedLog()
        self.master_faults = []  # (t, kind): the master taken away (for async loss windows)
        self.problems = []  # liveness and bound violations found during the run
        self.producers = []
        self.stock = None
        self.consumer = None
        self.observer = None
        self.read_errors = []

    # -- setup / teardown
    def start(self, raw_producers=4, stock=True, rate=40.0):
        g = self.group
        t = self.timeline
        t.add(f"seed {self.seed}; mode {g.mode}; --replica-lag-max-ms {g.flags['lag_max_ms']} "
              f"--master-timeout-ms {g.flags['master_timeout_ms']}; members "
              f"{[(m.id, m.addr) for m in g.members]}; work dir {self.work_dir}")
        g.start()
        master = g.master()
        wire.create_topic(master.addr, TOPIC, QUEUES)
        wire.commit_offsets(master.addr, CONSUMER_GROUP, TOPIC, QUEUES, 0)
        for m in g.members:
            wait_until(lambda m=m: route_master([m.addr], TOPIC), 30, f"{m} to route {TOPIC}")
        self.observer = Observer(g, t)
        self.observer.start()
        namesrv = ";".join(m.addr for m in g.members)
        self.consumer = Consumer(namesrv, self.work_dir)
        addrs = [m.addr for m in g.members]
        for i in range(raw_producers):
            p = RawProducer(f"r{i}", addrs, self.recorder, inflight=4, rate=rate)
            p.start()
            self.producers.append(p)
        if stock:
            self.stock = StockProducer(namesrv, TOPIC, QUEUES, self.work_dir, rate=rate).start()
        wait_until(lambda: self.acked() >= 200, 90, "the first 200 acknowledged sends")
        t.add(f"workload running: {len(self.producers)} raw producers x 4 in flight, "
              f"{'the stock producer, ' if stock else ''}the stock push consumer; master {master}")

    def acked(self):
        n = self.recorder.count()
        if self.stock is not None:
            n += len(self.stock.history().acks)
        return n

    def stop_workload(self):
        for p in self.producers:
            p.stop()
        for p in self.producers:
            p.join(30)
        stock_history = self.stock.stop() if self.stock else None
        return stock_history

    def close(self):
        """Stops everything this run started (idempotent; also on failure)."""
        for p in self.producers:
            p.stop()
        if self.stock is not None:
            try:
                self.stock.stop()
            except Exception:
                pass
        if self.consumer is not None:
            self.consumer.shutdown()
        if self.observer is not None and self.observer.is_alive():
            self.observer.stop()
        try:
            self.net.heal()
        except Exception:
            pass

    # -- helpers for faults
    def master(self):
        m = self.group.master()
        assert m is not None, f"no master: {self.group.views()}\n{self.timeline.text(30)}"
        return m

    def replicas(self, master):
        return [m for m in self.group.members if m is not master]

    def note_master_fault(self, t, kind, victim):
        self.master_faults.append((t, kind))

    def read_all(self, why):
        """Reads every running member from offset 0 and records what each serves."""
        summary = []
        for m in self.group.members:
            if not m.alive() or m.paused:
                summary.append(f"{m.id}: down")
                continue
            t = now()
            try:
                rows = read_member(m)
            except (AssertionError, OSError, ValueError) as error:
                self.read_errors.append((round(t, 3), m.id, why, str(error)[:200]))
                summary.append(f"{m.id}: read failed ({str(error)[:80]})")
                continue
            self.served.add(f"member-{m.id}", t, rows)
            summary.append(f"{m.id}: {len(rows)}")
        conflicts = self.served.conflicts_now()
        self.timeline.add(f"read every member from offset 0 ({why}): records served "
                          f"{', '.join(summary)}; (queue, offset) served with two keys so far: "
                          f"{len(conflicts)}")

    def recover(self, why, timeout=90):
        """After a heal: a writable master and every member in sync, within `timeout`; a group
        that does not get there is a liveness failure (recorded, the run goes on)."""
        t0 = now()
        try:
            m = self.group.wait_writable(timeout=timeout)
            self.group.wait_in_sync(len(self.group.members), timeout=max(10, timeout - (now() - t0)))
        except AssertionError as error:
            self.problems.append(f"after {why}: the group did not recover within {timeout} s: {error}")
            self.timeline.add(f"NOT RECOVERED after {why}: {error}")
            return None
        self.timeline.add(f"recovered after {why}: {m} writable master, all in sync, "
                          f"{now() - t0:.1f} s after the heal")
        return m

    # -- the faults (each under load; each heals itself and waits for recovery)
    def hold(self, low, high):
        d = self.rng.uniform(low, high)
        time.sleep(d)
        return d

    def pause_time(self):
        longest = max(self.group.flags["lag_max_ms"], self.group.flags["master_timeout_ms"]) / 1000
        return longest + 1.0, longest + 4.0

    def f_pause(self, victim, what):
        master = self.group.master()
        t = self.timeline.add(f"FAULT pause (SIGSTOP) {victim} ({what})")
        if victim is master:
            self.note_master_fault(t, "pause", victim)
        victim.pause()
        d = self.hold(*self.pause_time())
        victim.resume()
        self.timeline.add(f"HEAL resume (SIGCONT) {victim} after {d:.1f} s")
        self.read_all(f"right after resuming {victim}")
        return victim

    def f_kill9(self, victim, what, wipe=False, down=(0.5, 3.0)):
        master = self.group.master()
        t = self.timeline.add(f"FAULT kill -9 {victim} ({what}){' and wipe its data directory' if wipe else ''}")
        if victim is master:
            self.note_master_fault(t, "kill", victim)
        victim.kill9()
        self.hold(*down)
        victim.start(wipe=wipe)
        self.timeline.add(f"HEAL restarted {victim}{' on an empty data directory' if wipe else ''}")
        self.read_all(f"right after restarting {victim}")
        return victim

    def f_partition(self, what, apply, master_cut, expect=(), low=3.0, high=6.0):
        """expect: [(from member id or None for the root namespace, to member, "timeout" or
        "connected")]: connects checked once the rules are in (a cut must drop: time out, not
        be refused); a mismatch fails the run."""
        t = self.timeline.add(f"FAULT partition: {what}")
        if master_cut:
            self.note_master_fault(t, "partition", None)
        apply()
        seen = []
        for src, dst, want in expect:
            got = self.net.probe_from(src, dst.host, dst.port)
            seen.append(f"{'root' if src is None else src}->{dst.id}: {got}")
            if got != want:
                self.problems.append(f"partition '{what}': a connect from "
                                     f"{'the root namespace' if src is None else f'member-{src}'} "
                                     f"to {dst} gave {got!r}, expected {want!r} "
                                     f"(rules {self.net.describe()})")
        self.timeline.add(f"rules in force: {self.net.describe()}; connects: {seen}")
        d = max(0.0, self.rng.uniform(low, high) - (now() - t))
        time.sleep(d)
        self.net.heal()
        self.timeline.add(f"HEAL partition after {now() - t:.1f} s")
        self.read_all("right after the partition healed")

    def consensus_leader_or_note(self, fault):
        """The consensus leader; when it cannot be known, a problem that fails the run (the
        schedule goes on without this fault)."""
        try:
            return self.group.consensus_leader()
        except AssertionError as error:
            self.problems.append(f"{fault}: {error}")
            self.timeline.add(f"SKIPPED {fault} (fails the run): {error}")
            return None

    def isolated(self, victim):
        other = next(m for m in self.group.members if m is not victim)
        return [(None, victim, "timeout"), (victim.id, other, "timeout")]

    def fault(self, name):
        g = self.group
        master = self.master()
        replicas = self.replicas(master)
        rng = self.rng
        if name == "pause-master":
            self.f_pause(master, "master")
        elif name == "pause-replica":
            for r in replicas:  # each replica in turn
                self.f_pause(r, "replica")
                self.recover(f"pausing replica {r}")
        elif name == "pause-consensus-leader":
            leader = self.consensus_leader_or_note(name)
            if leader is None:
                return
            self.f_pause(leader, "consensus leader" + (", also master" if leader is master else ""))
        elif name == "kill9-master":
            # Down for longer than the master timeout, so that the group fails over.
            self.f_kill9(master, "master", down=(2.0, 4.0))
        elif name == "kill9-replica":
            self.f_kill9(rng.choice(replicas), "replica")
        elif name == "wipe-replica":
            self.f_kill9(rng.choice(replicas), "replica", wipe=True)
        elif name == "wipe-replica-then-kill9-master":
            victim = rng.choice(replicas)
            t = self.timeline.add(f"FAULT kill -9 {victim} (replica), wipe its data directory, "
                                  f"restart; then kill -9 of the master {master} within 3 s")
            victim.kill9()
            victim.start(wipe=True)
            time.sleep(rng.uniform(0.0, 3.0) * 0.9)
            t = self.timeline.add(f"FAULT kill -9 {master} (master), {victim} was wiped")
            self.note_master_fault(t, "kill", master)
            master.kill9()
            self.hold(1.0, 3.0)
            master.start()
            self.timeline.add(f"HEAL restarted {master}")
            self.read_all(f"right after restarting {master}")
        elif name == "isolate-member":
            victim = rng.choice(g.members)
            self.f_partition(f"{victim} isolated (all its packets dropped)"
                             + (" - it is the master" if victim is master else ""),
                             lambda: self.net.isolate(victim.id), victim is master,
                             self.isolated(victim))
        elif name == "isolate-master":
            self.f_partition(f"the master {master} isolated (all its packets dropped)",
                             lambda: self.net.isolate(master.id), True, self.isolated(master))
        elif name == "isolate-consensus-leader":
            leader = self.consensus_leader_or_note(name)
            if leader is None:
                return
            self.f_partition(f"the consensus leader {leader} isolated"
                             + (" - it is also the master" if leader is master else ""),
                             lambda: self.net.isolate(leader.id), leader is master,
                             self.isolated(leader))
        elif name == "cut-master-from-replicas":
            def apply():
                for r in replicas:
                    self.net.cut(master.id, r.id)
            self.f_partition(f"the master {master} cut from its replicas (clients still reach it)",
                             apply, True, [(replicas[0].id, master, "timeout"),
                                           (master.id, replicas[1], "timeout"),
                                           (None, master, "connected")])
        elif name == "replicas-cannot-reach-master":
            def apply():
                for r in replicas:
                    self.net.cut_one_way(r.id, master.id)
            self.f_partition(f"one-way: the replicas' packets to the master {master} dropped "
                             f"(the master's reach them)", apply, True,
                             [(replicas[0].id, master, "timeout"), (None, master, "connected")])
        else:
            raise ValueError(name)
        self.recover(name)
        self.read_all(f"after {name}")

    # -- the end
    def finish(self, consumer_timeout=180):
        """Heals everything, waits for the group to be whole, stops the workload, reads every
        member until they agree (bounded), waits for the consumer (bounded), runs the checker.
        Returns (report, failure text or None)."""
        g = self.group
        tl = self.timeline
        self.net.heal()
        for m in g.members:
            if m.alive() and m.paused:
                m.resume()
            if not m.alive():
                m.start()
        tl.add("final heal: every member running, no partition")
        self.recover("the final heal", timeout=120)
        stock_history = self.stop_workload()
        tl.add(f"workload stopped: raw acked {self.recorder.count()}, refused {self.recorder.not_ok}, "
               f"unknown (in flight when a connection died) {self.recorder.unknown}; stock: "
               f"{stock_history.summary() if stock_history else 'none'}")
        errors = [f"{p.pname}: {p.error}" for p in self.producers if p.error]
        if errors:
            self.problems.append(f"producer threads failed: {errors}")
        acks = list(self.recorder.acks)
        sent = set(self.recorder.sent)
        if self.stock is not None:
            stock_acks, stock_sent, _ = self.stock.records()
            acks += stock_acks
            sent |= stock_sent

        # Every member serves the same after catch-up (bounded); the last reads are final.
        final = {}
        deadline = now() + 60
        while True:
            final = {}
            for m in g.members:
                t = now()
                try:
                    rows = read_member(m)
                except (AssertionError, OSError, ValueError) as error:
                    rows = None
                    self.read_errors.append((round(t, 3), m.id, "final", str(error)[:200]))
                if rows is not None:
                    self.served.add(f"member-{m.id}", t, rows)
                    final[f"member-{m.id}"] = rows
            maps = [sorted(r) for r in final.values()]
            if len(final) == len(g.members) and all(x == maps[0] for x in maps):
                break
            if now() > deadline:
                tl.add("members still serve different records 60 s after the final heal")
                break
            time.sleep(1)
        unread = [m for m in g.members if f"member-{m.id}" not in final]
        if unread:
            self.problems.append(f"members that could not be read at the end: {unread} "
                                 f"(errors {[e for e in self.read_errors if e[2] == 'final'][-3:]})")
        master = g.master()
        final_master = f"member-{master.id}" if master else "none"
        tl.add(f"final reads: {({k: len(v) for k, v in final.items()})}; final master {final_master}")

        # The consumer group: until it has every acknowledged key, or its committed offsets
        # reach the end of every queue of the final master (it consumed all it will), or it
        # got nothing new for 45 s (the stock client refreshes routes every 30 s); at most
        # `consumer_timeout` s.
        acked_keys = {a.key for a in acks}
        ends = {}
        for q, o, _ in final.get(final_master, []):
            ends[q] = max(ends.get(q, 0), o + 1)
        deadline = now() + consumer_timeout
        count, progress_at, why = -1, now(), f"{consumer_timeout} s passed"
        while now() < deadline:
            deliveries = self.consumer.deliveries()
            if {d.key for d in deliveries} >= acked_keys:
                why = "it has every acknowledged message"
                break
            if self.consumer.exited():
                self.problems.append(self.consumer.exited())
                why = "it exited"
                break
            if len(deliveries) != count:
                count, progress_at = len(deliveries), now()
            elif now() - progress_at > 45:
                why = "nothing new for 45 s"
                break
            if master is not None and ends:
                committed = self.observer.committed_on(master)
                if all(committed.get(q, -1) >= end for q, end in ends.items()):
                    why = f"its committed offsets reached the end of every queue ({committed})"
                    break
            time.sleep(1)
        tl.add(f"stopped waiting for the consumer group: {why}")
        time.sleep(2)  # the consumer commits what it consumed; then the last committed offsets
        if master is not None:
            self.observer.sample_commits(master)
        self.observer.stop()
        deliveries = self.consumer.deliveries()
        self.consumer.shutdown()
        if self.observer.error:
            self.problems.append(f"observer failed: {self.observer.error}")
        if self.observer.same_epoch_masters:
            self.problems.append(f"two members master of the same epoch: "
                                 f"{self.observer.same_epoch_masters[:5]}")

        windows = None
        if g.mode == "async":
            windows = loss_windows(self.master_faults, g.flags["lag_max_ms"] / 1000,
                                   g.flags["master_timeout_ms"] / 1000)
        report = check_run(acks, sent, self.served.served(), final, final_master, deliveries,
                           self.observer.commits, loss_windows=windows)
        tl.add(f"CHECKER seed {self.seed} mode {g.mode}: {report.summary()}")
        if self.read_errors:
            tl.add(f"reads that failed during the run (not a checker violation; a member that "
                   f"refuses a read serves nothing wrong): {len(self.read_errors)}, e.g. "
                   f"{self.read_errors[:3]}")
        if windows is not None:
            tl.add(f"async loss: {len(report.lost_in_window)} acknowledged messages lost within "
                   f"the windows (--replica-lag-max-ms before each fault that took the master "
                   f"away, to --master-timeout-ms after a partition): {[(round(a, 2), round(b, 2)) for a, b in windows]}; "
                   f"{len(report.lost)} lost outside them")
        self.dump(acks, deliveries, final, report)
        failure = None
        if report.violations() or self.problems:
            failure = self.explain(report, final)
        return report, failure

    def dump(self, acks, deliveries, final, report):
        path = os.path.join(self.work_dir, "nemesis-history.json")
        with open(path, "w") as f:
            json.dump({"seed": self.seed, "timeline": self.timeline.text(),
                       "acks": [a.__dict__ for a in acks],
                       "deliveries": [d.__dict__ for d in deliveries],
                       "final": final, "commits": self.observer.commits,
                       "epochs": self.observer.epochs,
                       "read_errors": self.read_errors,
                       "report": report.summary()}, f, default=str)

    def explain(self, report, final):
        lines = [f"nemesis seed {self.seed} (QUIVER_NEMESIS_SEED={self.seed} reruns this "
                 f"schedule), mode {self.group.mode}: {report.summary()}"]
        lines += [f"run problem: {p}" for p in self.problems]
        for p in report.problems(limit=15):
            lines.append(f"checker: {p}")
        if report.lost:
            by_member = {}
            for key, q, o, *_ in report.lost[:15]:
                by_member[key] = {m: next((k for qq, oo, k in rows if (qq, oo) == (q, o)), None)
                                  for m, rows in final.items()}
            lines.append(f"lost keys: what each member holds at their acknowledged (queue, offset) "
                         f"now: {by_member}")
            lost_t = sorted(x[3] for x in report.lost)
            lines.append(f"lost acknowledged between +{lost_t[0] - self.timeline.t0:.2f}s and "
                         f"+{lost_t[-1] - self.timeline.t0:.2f}s of the timeline")
        lines.append(f"epochs (first seen +s, master): "
                     f"{sorted((e, round(t - self.timeline.t0, 2), i) for e, (t, i) in self.observer.epochs.items())}")
        lines.append(f"read errors: {self.read_errors[:10]}")
        lines.append(f"fault timeline:\n{self.timeline.text()}")
        lines.append(f"temp dir with member logs (member-N.log) and nemesis-history.json: {self.work_dir}")
        return "\n".join(lines)


SCHEDULE = ["pause-master", "pause-replica", "pause-consensus-leader", "kill9-master",
            "kill9-replica", "wipe-replica", "wipe-replica-then-kill9-master", "isolate-member",
            "isolate-master", "isolate-consensus-leader", "cut-master-from-replicas",
            "replicas-cannot-reach-master"]


def seed_from_env(default_rng=None):
    value = os.environ.get("QUIVER_NEMESIS_SEED")
    if value:
        return int(value)
    return random.SystemRandom().randrange(1, 2 ** 31)
