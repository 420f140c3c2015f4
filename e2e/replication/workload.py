"""The workload around the stock client: a producer with retries (a new producer process,
hence a fresh route, after every send that was not acknowledged, retrying the same key) and a
push consumer process; both record what happened in files the test reads."""

import json
import os
import subprocess
import sys
import threading
import time

import remoting
import wire
from checker import Ack, Stored

HERE = os.path.dirname(os.path.abspath(__file__))


class History:
    """What the producer processes recorded, parsed from their common file."""

    def __init__(self, lines):
        self.acks = []  # Ack, in the order the sends were acknowledged
        self.ack_times = []  # monotonic seconds, same order
        self.ack_started = []  # when the acknowledged attempt was sent, same order
        tried = {}
        self.sent = set()  # every key tried
        self.failures = []  # (n, monotonic, text): send raised
        self.not_ok = []  # (n, status, monotonic): answered but not SEND_OK
        for line in lines:
            kind, _, rest = line.partition(" ")
            parts = rest.split(" ")
            try:
                if kind == "try":
                    self.sent.add(f"k-{parts[0]}")
                    tried[parts[0]] = float(parts[1])
                elif kind == "ack":
                    self.acks.append(Ack(f"k-{parts[0]}", int(parts[1]), int(parts[2])))
                    self.ack_times.append(float(parts[3]))
                    self.ack_started.append(tried.get(parts[0], float(parts[3])))
                elif kind == "notok":
                    self.not_ok.append((int(parts[0]), parts[1], float(parts[2])))
                elif kind == "fail":
                    self.failures.append((int(parts[0]), float(parts[1]), " ".join(parts[2:])))
            except (IndexError, ValueError):
                pass  # a line cut short by a kill: ignored

    @property
    def next_key(self):
        return int(self.acks[-1].key[2:]) + 1 if self.acks else 0

    def summary(self):
        statuses = {}
        for _, status, _ in self.not_ok:
            statuses[status] = statuses.get(status, 0) + 1
        kinds = {}
        for _, _, text in self.failures:
            kind = text.split(":", 1)[0]
            kinds[kind] = kinds.get(kind, 0) + 1
        return (f"sent keys={len(self.sent)} acked={len(self.acks)} "
                f"not SEND_OK={len(self.not_ok)} {statuses} raised={len(self.failures)} {kinds}")


class ProducerDriver:
    """Runs producer_main.py generations back to back until stopped."""

    def __init__(self, namesrv, topic, queues, work_dir, rate=200):
        self.namesrv, self.topic, self.queues, self.rate = namesrv, topic, queues, rate
        self.out_path = os.path.join(work_dir, f"producer-{topic}.log")
        self.stop_file = os.path.join(work_dir, f"producer-{topic}.stop")
        self.stderr_path = os.path.join(work_dir, f"producer-{topic}.stderr")
        self.generations = 0
        self.proc = None
        self.error = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self):
        open(self.out_path, "w").close()
        self._thread.start()
        return self

    def history(self):
        with open(self.out_path) as f:
            return History(f.read().splitlines())

    def _run(self):
        try:
            with open(self.stderr_path, "ab") as err:
                while not self._stopping.is_set():
                    first = self.history().next_key
                    self.generations += 1
                    self.proc = subprocess.Popen(
                        [sys.executable, os.path.join(HERE, "producer_main.py"), self.namesrv,
                         self.topic, str(self.queues), str(first), self.out_path, self.stop_file,
                         str(self.rate)],
                        stdout=err, stderr=subprocess.STDOUT)
                    self.proc.wait()
                    if self.proc.returncode == 0:
                        return
                    # A short back-off: a new process a few times a second while the group
                    # elects a master.
                    self._stopping.wait(0.2)
        except Exception as error:  # shown by stop()
            self.error = error

    def acked(self):
        return len(self.history().acks)

    def stop(self):
        self._stopping.set()
        open(self.stop_file, "w").close()
        self._thread.join(30)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self._thread.join(10)
        assert self.error is None, f"producer driver failed: {self.error}"
        return self.history()


class ConsumerProcess:
    """consumer_main.py: a push consumer group reading the topic for the whole test."""

    def __init__(self, namesrv, group, topic, work_dir):
        self.out_path = os.path.join(work_dir, f"consumer-{group}.jsonl")
        self.log_path = self.out_path + ".log"
        open(self.out_path, "w").close()
        self.read_to = 0
        self.deliveries = {}  # key -> times delivered
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "consumer_main.py"), namesrv, group, topic,
                 self.out_path], stdout=log, stderr=subprocess.STDOUT)

    def refresh(self):
        if self.proc.poll() is not None:
            with open(self.log_path, errors="replace") as log:
                raise AssertionError(f"the consumer process exited with {self.proc.returncode}:\n"
                                     f"{log.read()[-4000:]}")
        with open(self.out_path, encoding="utf-8") as out:
            out.seek(self.read_to)
            while True:
                line = out.readline()
                if not line.endswith("\n"):
                    break
                self.read_to = out.tell()
                key = json.loads(line)[0]
                self.deliveries[key] = self.deliveries.get(key, 0) + 1
        return self.deliveries

    def has_all(self, keys):
        delivered = self.refresh()
        return all(k in delivered for k in keys)

    def shutdown(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def stored(addr, topic, queues, prefix=""):
    """What the member at `addr` serves of `topic` as checker Stored entries (keys with
    `prefix` only), and the raw records."""
    records = wire.read_topic(addr, topic, queues)
    return [Stored(r["queue"], r["offset"], r["key"]) for r in records
            if r["key"].startswith(prefix)], records


def wait_placed(member, queues, timeout=60):
    """The consumer pulls from the master once its pulls are parked on every queue."""
    from quiver_e2e import wait_until
    wait_until(lambda: (member.metric("quiver_parked_pulls") or 0) >= queues, timeout,
               f"the consumer to park pulls on {member}")


def log(text):
    # A line of its own (pytest -q prints its progress dots without a newline).
    print(f"\n[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def post_mortem(group, topic, queues, history):
    """After a failed wait: what the group looks like and what the checker makes of the member
    that now claims to be master of the highest epoch (logged; the test fails anyway)."""
    from checker import check
    log(f"post-mortem: members (role, epoch, in sync): {group.views()}; producer: {history.summary()}")
    for m in group.members:
        if not m.alive() or m.paused:
            continue
        try:
            code, remark, _, body = remoting.call(m.addr, remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
            route = [b.get("brokerAddrs") for b in json.loads(body).get("brokerDatas", [])] if code == 0 else (code, remark)
            # To the probe topic, so the checker's topic holds only the producer's keys.
            sent = wire.send(m.addr, "ProbeTopic", f"post-mortem-{m.id}", "post-mortem", timeout=5)
        except (OSError, ValueError) as error:
            route, sent = error, None
        log(f"post-mortem: {m} routes {topic} to {route}; a raw send to it (code, remark, queue, offset): {sent}")
    master = group.master()
    if master is None:
        log("post-mortem: no member claims to be master")
        return
    try:
        contents, _ = stored(master.addr, topic, queues)
    except Exception as error:  # the test fails anyway: show why the read failed
        log(f"post-mortem: reading {topic} from {master} failed: {error}")
        return
    report = check(history.acks, contents, history.sent)
    log(f"post-mortem checker on {master}: {report.summary()}; {report.problems()[:3]}")
