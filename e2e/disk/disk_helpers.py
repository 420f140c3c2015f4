"""Helpers of the disk suite: a real tmpfs of a known size, a broker whose data directory is on
it (and whose log is not), a producer process that fills it, raw remoting calls that show the
broker's exact answer, and a reader that checks every acknowledged message comes back.

The broker process class, the client helpers and the remoting client are e2e/broker's own,
imported (run.sh puts e2e/broker and e2e/common on PYTHONPATH).
"""

import atexit
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BROKER_SUITE = os.path.join(HERE, "..", "broker")
if BROKER_SUITE not in sys.path:
    sys.path.insert(0, BROKER_SUITE)

MiB = 1024 * 1024
BODY_SIZE = 1024
SEND_MESSAGE = 10
UPDATE_CONSUMER_OFFSET = 15
GET_MAX_OFFSET = 30
SERVICE_NOT_AVAILABLE = 14


def body_of(i):
    """The 1 KiB body of key k-i: its sequence number repeated, so a mixed-up body shows."""
    unit = f"{i:010d}|"
    return (unit * (BODY_SIZE // len(unit) + 1))[:BODY_SIZE]


def _broker_suite_conftest():
    """e2e/broker/conftest.py under its own module name (ours is also called conftest)."""
    spec = importlib.util.spec_from_file_location(
        "quiver_e2e_broker_conftest", os.path.join(BROKER_SUITE, "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_broker_conftest = _broker_suite_conftest()


def run(cmd, check=True):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if check and done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def df(path):
    """(used bytes, total bytes, used ratio) of the file system holding `path`."""
    st = os.statvfs(path)
    total = st.f_blocks * st.f_frsize
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    return used, total, (used / total if total else 0.0)


class Tmpfs:
    """A tmpfs mounted on `mount_point`; the broker's data directory is `data_dir` inside it
    (a subdirectory, so that rm -rf can delete the directory itself)."""

    def __init__(self, mount_point, size_mib):
        self.mount_point = mount_point
        self.data_dir = os.path.join(mount_point, "data")
        self.size_mib = size_mib
        self.mounted = False

    def mount(self):
        os.makedirs(self.mount_point, exist_ok=True)
        done = run(["mount", "-t", "tmpfs", "-o", f"size={self.size_mib}m", "tmpfs", self.mount_point],
                   check=False)
        if done.returncode != 0:
            raise OSError(f"mount -t tmpfs -o size={self.size_mib}m tmpfs {self.mount_point} "
                          f"exited {done.returncode}: {done.stderr.strip()}")
        self.mounted = True
        os.makedirs(self.data_dir)
        return self

    def resize(self, size_mib):
        """Adds (or removes) space while the broker runs."""
        run(["mount", "-o", f"remount,size={size_mib}m", self.mount_point])
        self.size_mib = size_mib

    def remount_read_only(self):
        run(["mount", "-o", "remount,ro", self.mount_point])

    def usage(self):
        return df(self.mount_point)

    def unmount(self):
        if not self.mounted:
            return
        if run(["umount", self.mount_point], check=False).returncode != 0:
            # Something still holds it (a process we did not start?): detach it lazily.
            run(["umount", "-l", self.mount_point], check=False)
        self.mounted = False


def broker_has_disk_flags(binary):
    """Whether the binary has the disk-guard settings (the fix under test)."""
    done = run([binary, "--help"], check=False)
    return "--disk-check-interval-ms" in done.stdout


class DiskBroker(_broker_conftest.Broker):
    """e2e/broker's Broker, with its log outside the file system under test."""

    def __init__(self, data_dir, log_dir, flush_mode="async", early_retention=True, more=(), **kwargs):
        extra = ["--segment-size", str(16 * MiB), "--flush-mode", flush_mode] + list(more)
        if broker_has_disk_flags(_broker_conftest.BROKER_BIN):
            extra += ["--disk-check-interval-ms", "200"]
            if not early_retention:
                # Retention deletes CommitLog files early above --disk-clean-ratio (0.75: files
                # every group with committed offsets has read, so all of them while no group
                # has) and --disk-force-clean-ratio (0.85: the oldest, read or not), every 10 s.
                # On 48 MiB with 16 MiB files that frees a third of the disk before or just
                # after the 0.90 refusal and deletes acknowledged, unconsumed messages. At 1.0
                # neither ratio can be exceeded: the disk really fills and stays full.
                extra += ["--disk-clean-ratio", "1.0", "--disk-force-clean-ratio", "1.0"]
        super().__init__(data_dir, extra=extra, **kwargs)
        self.log_path = os.path.join(log_dir, f"{self.name}.log")

    def exit_description(self):
        code = self.proc.poll()
        if code is None:
            return "running"
        if code < 0:
            return f"killed by signal {-code} ({signal.Signals(-code).name})"
        return f"exited with code {code}"

    def assert_alive(self, when):
        assert self.proc.poll() is None, (
            f"the broker died {when}: {self.exit_description()}\n---- log tail ----\n"
            f"{self.log_tail(40)}")

    def metric_value(self, name, **labels):
        """Sum of a metric's samples (with or without labels) whose labels include `labels`."""
        _, text = self.http("/metrics")
        total = None
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            metric = series.split("{", 1)[0]
            if metric != name:
                continue
            if all(f'{k}="{v}"' in series for k, v in labels.items()):
                total = (total or 0) + float(value)
        return total

    def log_text(self):
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")


# ---- raw remoting: the broker's exact code and remark --------------------------------------

def _remoting():
    import remoting  # e2e/broker/remoting.py
    return remoting


def raw_send(addr, topic, key, body, queue_id=0):
    """SEND_MESSAGE (V1 header) as a client would; returns (code, remark)."""
    ext = {
        "producerGroup": "quiver-disk-raw",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": queue_id,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": f"KEYS\x01{key}\x02",
        "reconsumeTimes": 0,
        "unitMode": "false",
        "batch": "false",
    }
    code, remark, _, _ = _remoting().call(addr, SEND_MESSAGE, ext, body.encode())
    return code, remark or ""


def queue_count(addr, topic):
    code, remark, _, body = _remoting().call(addr, _remoting().GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert code == 0, f"route of {topic}: code {code} {remark}"
    return max(q["readQueueNums"] for q in json.loads(body)["queueDatas"])


def commit_offsets(addr, group, topic, offset=0):
    """UPDATE_CONSUMER_OFFSET on every queue: a new group then starts from `offset` (the C++
    push consumer of a group with no committed offset starts at the end of each queue)."""
    for queue in range(queue_count(addr, topic)):
        code, remark, _, _ = _remoting().call(addr, UPDATE_CONSUMER_OFFSET, {
            "consumerGroup": group, "topic": topic, "queueId": queue, "commitOffset": offset})
        assert code == 0, f"commit offset {offset} of {group} on {topic}:{queue}: code {code} {remark}"


def stored_count(addr, topic):
    """Messages the topic holds: the sum of GET_MAX_OFFSET over its queues (an admin read)."""
    total = 0
    for queue in range(queue_count(addr, topic)):
        code, remark, ext, _ = _remoting().call(addr, GET_MAX_OFFSET, {"topic": topic, "queueId": queue})
        assert code == 0, f"max offset of {topic}:{queue}: code {code} {remark}"
        total += int(ext["offset"])
    return total


# ---- producing -------------------------------------------------------------------------------

class FillResult:
    def __init__(self, lines):
        self.acked = {}  # key -> body
        self.failures = []  # (key index, seconds, client error text)
        self.not_ok = []
        self.stop = None
        self.next_index = 0
        for line in lines:
            kind, _, rest = line.partition(" ")
            if kind == "ack":
                i = int(rest.split()[0])
                self.acked[f"k-{i}"] = body_of(i)
                self.next_index = max(self.next_index, i + 1)
            elif kind == "fail":
                i, seconds, text = rest.split(" ", 2)
                self.failures.append((int(i), float(seconds), text))
                self.next_index = max(self.next_index, int(i) + 1)
            elif kind == "notok":
                self.not_ok.append(rest)
                self.next_index = max(self.next_index, int(rest.split()[0]) + 1)
            elif kind == "stop":
                self.stop = rest

    def summary(self):
        last = self.failures[-1][2] if self.failures else "none"
        return (f"{len(self.acked)} acknowledged, {len(self.failures)} failed, "
                f"{len(self.not_ok)} not SEND_OK, stopped by {self.stop}; last client error: {last}")


def fill(namesrv, topic, out_path, first=0, max_count=200_000, fail_streak=5, deadline_s=240):
    """Runs fill_main.py; returns what it recorded (acknowledged keys survive its death)."""
    cmd = [sys.executable, os.path.join(HERE, "fill_main.py"), namesrv, topic, str(first),
           str(max_count), str(fail_streak), str(deadline_s), out_path]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=deadline_s + 60)
        output = done.stdout + done.stderr
    except subprocess.TimeoutExpired as e:
        output = f"fill_main timed out: {e}"
    if not os.path.exists(out_path):
        raise AssertionError(f"fill_main.py recorded nothing:\n{output}")
    with open(out_path) as f:
        result = FillResult(f.read().splitlines())
    result.output = output
    return result


# ---- consuming -------------------------------------------------------------------------------

class Reader:
    """What a push consumer received: for each key, every (queue, offset) it was delivered from,
    how often, and whether the body matched. Callbacks run on the client's C++ threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.positions = {}  # key -> {(queue_id, queue_offset): deliveries}
        self.bodies = {}  # key -> set of bodies seen
        self.total = 0

    def record(self, key, queue_id, queue_offset, body):
        position = (queue_id, queue_offset)
        with self.lock:
            seen = self.positions.setdefault(key, {})
            seen[position] = seen.get(position, 0) + 1
            self.bodies.setdefault(key, set()).add(body)
            self.total += 1

    def count(self):
        with self.lock:
            return len(self.positions)

    def has_all(self, keys):
        with self.lock:
            return all(k in self.positions for k in keys)

    def check(self, expected):
        """Every expected key read back with its exact body; no key stored twice. The same
        stored message delivered again (same queue and offset) is the client's redelivery and
        allowed."""
        with self.lock:
            missing = [k for k in expected if k not in self.positions]
            wrong = [k for k, body in expected.items()
                     if k in self.bodies and self.bodies[k] != {body}]
            stored_twice = {k: sorted(self.positions[k]) for k in expected
                            if k in self.positions and len(self.positions[k]) > 1}
        problems = []
        if missing:
            problems.append(f"{len(missing)} of {len(expected)} acknowledged messages never read "
                            f"back, e.g. {sorted(missing, key=_key_order)[:10]}")
        if wrong:
            problems.append(f"{len(wrong)} messages read back with a different body, e.g. {wrong[:5]}")
        if stored_twice:
            sample = dict(list(stored_twice.items())[:5])
            problems.append(f"{len(stored_twice)} acknowledged messages stored more than once "
                            f"(different queue offsets): {sample}")
        assert not problems, "; ".join(problems)


def _key_order(key):
    try:
        return int(key.split("-", 1)[1])
    except ValueError:
        return 0


_READER_DIRS = []


def _reader_dir():
    """A directory for a reader's deliveries (bodies included), removed at exit."""
    if not _READER_DIRS:
        _READER_DIRS.append(tempfile.mkdtemp(prefix="quiver-disk-readers-"))
        atexit.register(shutil.rmtree, _READER_DIRS[0], True)
    return _READER_DIRS[0]


class ProcessReader(Reader):
    """A Reader fed by read_main.py, a push consumer in its own process (the C++ client can
    abort its process at shutdown); `shutdown` terminates that process."""

    def __init__(self, namesrv, group, topic, out_path):
        super().__init__()
        self.out_path = out_path
        self.read_to = 0
        open(out_path, "w").close()
        self.log_path = out_path + ".log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.join(HERE, "read_main.py"), namesrv, group, topic,
                 out_path],
                stdout=log, stderr=subprocess.STDOUT)

    def alive(self):
        """Fails, with the reader's own output, if its process died."""
        if self.proc.poll() is not None:
            with open(self.log_path, errors="replace") as log:
                raise AssertionError(f"the reader process exited with {self.proc.returncode}:\n"
                                     f"{log.read()[-4000:]}")

    def refresh(self):
        with open(self.out_path, encoding="utf-8") as out:
            out.seek(self.read_to)
            while True:
                line = out.readline()
                if not line.endswith("\n"):
                    break  # not written whole yet: read again next time
                self.read_to = out.tell()
                self.record(*json.loads(line))

    def count(self):
        self.alive()
        self.refresh()
        return super().count()

    def has_all(self, keys):
        self.alive()
        self.refresh()
        return super().has_all(keys)

    def check(self, expected):
        self.refresh()
        super().check(expected)

    def shutdown(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.refresh()


def start_reader(namesrv, group, topic, work_dir=None):
    """A consumer group reading `topic`; returns (reader, handle to shut it down)."""
    out_dir = work_dir or _reader_dir()
    reader = ProcessReader(namesrv, group, topic, os.path.join(out_dir, f"read-{group}.jsonl"))
    return reader, reader


def poll(attempt, timeout, what):
    """Calls `attempt` (returning (done, detail)) until done; fails after `timeout` seconds
    showing the last detail. Returns (seconds taken, last detail)."""
    started = time.monotonic()
    deadline = started + timeout
    while True:
        done, detail = attempt()
        if done:
            return time.monotonic() - started, detail
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {detail!r}")
        time.sleep(0.1)


PERCENT = re.compile(r"\d+(\.\d+)?\s*%")
