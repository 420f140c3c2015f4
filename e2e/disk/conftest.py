"""Fixtures: a tmpfs of a known size per test (root only: the tests fail, never skip, without
it) and quiver-broker processes whose data directory is on it and whose log is not."""

import os
import shutil
import tempfile

import pytest

from disk_helpers import DiskBroker, Tmpfs

TMPFS_MIB = 48


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skipped test of this suite is a failure: a skip must never pass for a green run."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped:
        report.outcome = "failed"
        report.longrepr = f"skipped, which this suite counts as a failure: {report.longrepr}"


@pytest.fixture
def disk():
    """A fresh 48 MiB tmpfs; `disk.data_dir` is a directory inside it, `disk.log_dir` and
    `disk.work_dir` are on the ordinary file system."""
    if os.geteuid() != 0:
        pytest.fail("e2e/disk mounts tmpfs file systems (mount -t tmpfs, remount) and must run as "
                    "root, as CI does; run scripts/test-all.sh or this run.sh as root")
    base = tempfile.mkdtemp(prefix="quiver-disk-")
    fs = Tmpfs(os.path.join(base, "mnt"), TMPFS_MIB)
    fs.log_dir = os.path.join(base, "logs")
    fs.work_dir = os.path.join(base, "work")
    os.makedirs(fs.log_dir)
    os.makedirs(fs.work_dir)
    try:
        fs.mount()
    except OSError as error:
        shutil.rmtree(base, ignore_errors=True)
        pytest.fail(f"e2e/disk needs a real tmpfs and could not mount one: {error}")
    try:
        yield fs
    finally:
        # The brokers are already stopped: make_broker depends on this fixture.
        fs.unmount()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def make_broker(disk):
    started = []

    def make(name="broker-0", flush_mode="async", **kwargs):
        broker = DiskBroker(disk.data_dir, disk.log_dir, flush_mode=flush_mode, name=name, **kwargs)
        started.append(broker)
        return broker

    yield make
    for broker in started:
        if broker.proc is not None and broker.proc.poll() is None:
            broker.proc.kill()
            broker.proc.wait(timeout=10)
        # Shown by pytest only when the test failed.
        print(f"---- {broker.name} log tail ----\n{broker.log_tail(200)}")
