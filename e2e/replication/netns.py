"""Network namespaces for the nemesis: each group member in a namespace of its own, joined by a
veth pair to a bridge in the root namespace, so that members have distinct addresses and a
partition is a set of iptables DROP rules inside the members' namespaces (packets dropped, not
refused: a connect across a cut times out).

    root namespace: bridge qvb<token> 10.77.<net>.1/24   (the test, the producers, the consumer)
    quiver-<token>-<i>: veth 10.77.<net>.<i+2>/24        (member i; lo up)

Every namespace, veth and bridge made here is removed by `teardown` (registered with atexit as
well, so an interrupted run cleans up). Needs root, `ip` (iproute2) and `iptables`: `Net.create`
raises NetUnavailable with the reason otherwise (the partition tests then FAIL with it).

The test reaches a member through its namespace's loopback (`Net.inside`, a per-thread setns),
so reads and /metrics of an isolated member still work: the rules never drop loopback traffic.
"""

import atexit
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_ROOT_NS_FD = None
_NETS = []
_lock = threading.Lock()


class NetUnavailable(Exception):
    pass


def _run(args, check=True):
    done = subprocess.run(args, capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetUnavailable(f"`{' '.join(args)}` failed ({done.returncode}): "
                             f"{(done.stdout + done.stderr).strip()}")
    return done


def _setns(fd):
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


class Net:
    """A bridge and `size` namespaces; `addr(i)` is member i's address."""

    def __init__(self, size):
        self.size = size
        self.token = f"{os.getpid() % 100000:05d}{len(_NETS)}"
        self.net = 1 + (os.getpid() + len(_NETS)) % 250
        self.bridge = f"qvb{self.token}"
        self.namespaces = [f"quiver-{self.token}-{i}" for i in range(size)]
        self.veths = [f"qv{self.token}h{i}" for i in range(size)]
        self.rules = {i: [] for i in range(size)}  # member -> iptables rule args in force
        self.created = []  # ("ns", name) / ("link", name), for teardown
        self._fds = {}

    @property
    def host_addr(self):
        return f"10.77.{self.net}.1"

    def addr(self, i):
        return f"10.77.{self.net}.{i + 2}"

    @classmethod
    def create(cls, size):
        if os.geteuid() != 0:
            raise NetUnavailable("partitions need root (network namespaces, iptables): "
                                 f"running as uid {os.geteuid()}")
        for tool in ("ip", "iptables"):
            if shutil.which(tool) is None:
                raise NetUnavailable(f"partitions need `{tool}` on PATH (Debian packages iproute2, "
                                     "iptables: e2e/replication/apt.txt)")
        net = cls(size)
        # A subnet no interface of this machine uses yet (a run killed without its cleanup
        # may have left a bridge behind).
        used = _run(["ip", "-o", "-4", "addr", "show"], check=False).stdout
        for step in range(250):
            if f" 10.77.{net.net}." not in used:
                break
            net.net = 1 + (net.net + 1) % 250
        with _lock:
            _NETS.append(net)
        try:
            net._setup()
        except Exception:
            net.teardown()
            raise
        return net

    def _setup(self):
        global _ROOT_NS_FD
        if _ROOT_NS_FD is None:
            _ROOT_NS_FD = os.open("/proc/self/ns/net", os.O_RDONLY)
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self.created.append(("link", self.bridge))
        _run(["ip", "addr", "add", f"{self.host_addr}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for i, ns in enumerate(self.namespaces):
            _run(["ip", "netns", "add", ns])
            self.created.append(("ns", ns))
            host, inner = self.veths[i], f"qv{self.token}n{i}"
            _run(["ip", "link", "add", host, "type", "veth", "peer", "name", inner])
            self.created.append(("link", host))
            _run(["ip", "link", "set", inner, "netns", ns])
            _run(["ip", "link", "set", host, "master", self.bridge])
            _run(["ip", "link", "set", host, "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addr(i)}/24", "dev", inner])
            _run(["ip", "-n", ns, "link", "set", inner, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            # iptables works in the namespace (its own tables), and loopback is never cut.
            self._ipt(i, ["-F"])
            self._ipt(i, ["-A", "INPUT", "-i", "lo", "-j", "ACCEPT"])
            self._ipt(i, ["-A", "OUTPUT", "-o", "lo", "-j", "ACCEPT"])
            self._fds[i] = os.open(f"/var/run/netns/{ns}", os.O_RDONLY)
        # The bridge forwards between members: wait until each answers ARP (a connect to a
        # closed port is refused once it does).
        for i in range(self.size):
            deadline = time.monotonic() + 20
            while True:
                problem = self._probe(self.addr(i), 9, timeout=1)
                if problem == "refused":
                    break
                if time.monotonic() > deadline:
                    raise NetUnavailable(f"namespace {self.namespaces[i]} ({self.addr(i)}) "
                                         f"unreachable from the root namespace: {problem}")
                time.sleep(0.2)

    def _ipt(self, i, args):
        return _run(["ip", "netns", "exec", self.namespaces[i], "iptables", "-w", "5"] + args)

    def exec_prefix(self, i):
        """Prefix a command with this to run it in member i's namespace (`ip netns exec`
        execs the command: the child's pid is the command's)."""
        return ["ip", "netns", "exec", self.namespaces[i]]

    @contextlib.contextmanager
    def inside(self, i):
        """This thread in member i's namespace for the block (sockets made in it stay there)."""
        _setns(self._fds[i])
        try:
            yield
        finally:
            _setns(_ROOT_NS_FD)

    # ---- faults -------------------------------------------------------------------------
    def _add(self, i, rule):
        self._ipt(i, ["-A"] + rule)
        self.rules[i].append(rule)

    def isolate(self, i):
        """Every packet to or from member i dropped (loopback inside its namespace excepted)."""
        self._add(i, ["INPUT", "-j", "DROP"])
        self._add(i, ["OUTPUT", "-j", "DROP"])

    def cut(self, i, j):
        """Members i and j cannot exchange packets (both ways); others are unaffected."""
        self._add(i, ["INPUT", "-s", self.addr(j), "-j", "DROP"])
        self._add(i, ["OUTPUT", "-d", self.addr(j), "-j", "DROP"])

    def cut_one_way(self, src, dst):
        """Packets from `src` to `dst` are dropped where they arrive; `dst` still reaches `src`
        (its packets arrive, the answers do not)."""
        self._add(dst, ["INPUT", "-s", self.addr(src), "-j", "DROP"])

    def heal(self):
        for i in range(self.size):
            for rule in reversed(self.rules[i]):
                self._ipt(i, ["-D"] + rule)
            self.rules[i] = []

    def describe(self):
        return {i: [" ".join(r) for r in rules] for i, rules in self.rules.items() if rules}

    # ---- checks ---------------------------------------------------------------------------
    @staticmethod
    def _probe(addr, port, timeout):
        """'connected', 'refused', 'timeout' or the error of a TCP connect."""
        s = socket.socket()
        s.settimeout(timeout)
        try:
            s.connect((addr, port))
            return "connected"
        except ConnectionRefusedError:
            return "refused"
        except socket.timeout:
            return "timeout"
        except OSError as error:
            return f"error {error}"
        finally:
            s.close()

    def probe_from(self, i, addr, port, timeout=1.5):
        """A connect from inside member i's namespace (i None: the root namespace)."""
        if i is None:
            return self._probe(addr, port, timeout)
        with self.inside(i):
            return self._probe(addr, port, timeout)

    def teardown(self):
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds = {}
        for kind, name in reversed(self.created):
            if kind == "ns":
                _run(["ip", "netns", "del", name], check=False)
            else:
                _run(["ip", "link", "del", name], check=False)
        self.created = []


def _terminate(signum, frame):
    # A SIGTERM (a CI timeout, someone ending the run) would end the process without atexit
    # handlers or pytest's finalizers: as an interrupt they run, so members are killed and
    # namespaces removed.
    raise KeyboardInterrupt(f"signal {signum}")


if threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
    signal.signal(signal.SIGTERM, _terminate)


@atexit.register
def _teardown_all():
    for net in _NETS:
        try:
            net.teardown()
        except Exception:  # best effort at exit
            pass
