"""Membership changes (`quiver replication members`) under the nemesis workload, judged by the
nemesis checker (nothing acknowledged lost, no (queue, offset) served with two keys, the consumer
group skips nothing): a fourth member added to a sync group of three, caught up into the in-sync
set, made master and removed again (mastership moves away first); a member (the master)
replaced by a new one; and a member restarted with other --group-members than its consensus
directory stores, which refuses to start naming both lists."""

import json
import os
import subprocess

import pytest

import wire
from nemesis import NsGroup, Run, read_member, seed_from_env
from netns import Net, NetUnavailable
from quiver_e2e import free_port, wait_until

QUIVER_CLI = os.path.join(os.environ.get("QUIVER_BIN_DIR", ""), "quiver")
MISMATCH = "does not match the group's membership"


def members_cli(addr, *args, wait_ms=60_000):
    """`quiver --server addr --output json replication members ARGS --wait-ms N`."""
    return subprocess.run(
        [QUIVER_CLI, "--server", addr, "--output", "json", "replication", "members", *args,
         "--wait-ms", str(wait_ms)],
        capture_output=True, text=True, timeout=wait_ms / 1000 + 30)


def members_change(addr, *args):
    """The membership (`{id: address}`) `quiver replication members ARGS` prints; fails with
    the CLI's output when it exits non-zero."""
    out = members_cli(addr, *args)
    assert out.returncode == 0, f"quiver replication members {args}: {out.stdout}{out.stderr}"
    return {int(k): v for k, v in json.loads(out.stdout)["members"].items()}


def status_members(member):
    """{id: address} of the members the status of `member` lists, and its in-sync set."""
    status = wire.status(member.addr) or {}
    listed = {r["replicaId"]: r["address"] for r in status.get("replicas", [])}
    return listed, set(status.get("inSyncReplicas", []))


def served_rows(member):
    try:
        return set(read_member(member))
    except (AssertionError, OSError, ValueError):
        return None


@pytest.fixture
def four_namespaces():
    """Four network namespaces on a bridge; a FAILURE (never a skip) when they cannot be made."""
    try:
        net = Net.create(4)
    except NetUnavailable as error:
        pytest.fail(f"the membership test runs its members in network namespaces, as the "
                    f"nemesis does, and cannot make them: {error}")
    try:
        yield net
    finally:
        net.teardown()


@pytest.fixture
def membership_run(four_namespaces, work_dir, request):
    """A Run of the nemesis workload on members 0-2 (a group of three); member 3 made, not
    started, with the four-member list. Everything started is stopped afterwards."""
    group = NsGroup(work_dir, four_namespaces, mode="sync")
    newcomer = group.members.pop()
    three = ",".join(f"{m.id}={m.addr}" for m in group.members)
    for m in group.members:
        m.members_arg = three
    run = Run(group, work_dir, seed_from_env())
    yield run, newcomer
    run.close()
    failed = getattr(request.node, "rep_call", None)
    for m in group.members + [newcomer]:
        if m.alive():
            if m.paused:
                m.resume()
            m.proc.kill()
            m.proc.wait(timeout=10)
        if failed is None or failed.failed:
            print(f"---- {m} log tail ----\n{m.log_tail(80)}")


@pytest.mark.timeout(480)
def test_a_fourth_member_is_added_under_load_caught_up_and_removed(membership_run):
    run, newcomer = membership_run
    group, timeline = run.group, run.timeline
    run.start()
    master = group.wait_writable(timeout=60)
    before = served_rows(master)
    assert before, f"{master} serves nothing after the first acknowledged sends"

    # Started with the four members and an empty directory, it waits to be added.
    newcomer.start(wipe=True)
    timeline.add(f"started {newcomer} with --group-members {newcomer.members_arg}")
    added = members_change(group.members[1].addr, "add", "--id", "3",
                           "--address", newcomer.addr)
    timeline.add(f"members add 3 answered {added}")
    assert added == {m.id: m.addr for m in group.members + [newcomer]}, added
    group.members.append(newcomer)

    def caught_up():
        master = group.master()
        if master is None:
            return None
        listed, in_sync = status_members(master)
        rows = served_rows(newcomer)
        return (listed == added and 3 in in_sync and rows is not None and rows >= before
                and newcomer.view()[0] == "replica")
    group.wait(caught_up, 120, f"{newcomer} in the in-sync set holding what was acknowledged "
                               f"before it was added")
    acked = run.acked()
    wait_until(lambda: run.acked() >= acked + 200, 90, "200 sends acknowledged by four members")
    for m in group.members:
        listed, _ = status_members(m)
        assert listed == added, f"{m} lists {listed}, the add answered {added}"
        assert m.metric("quiver_replication_members") == 4, f"{m}: {m.metrics()}"
    run.read_all("with four members")
    timeline.add(f"{newcomer} in sync with four members")

    # It takes mastership; its removal must then hand mastership to another member first.
    master = group.master()
    code, remark = wire.switchover(master.addr, newcomer.id, timeout_ms=3000)
    timeline.add(f"switchover {master} -> {newcomer}: code {code} {remark}")
    assert code == wire.SUCCESS, remark
    assert group.wait_writable(timeout=30) is newcomer, group.views()

    # Removed again (through a member that need not lead consensus), still under load.
    removed = members_change(group.members[0].addr, "remove", "--id", "3")
    timeline.add(f"members remove 3 answered {removed}")
    group.members.remove(newcomer)
    assert removed == {m.id: m.addr for m in group.members}, removed

    def shrunk():
        master = group.master()
        if master is None:
            return None
        listed, in_sync = status_members(master)
        return listed == removed and 3 not in in_sync and master.view()[2] == 3
    group.wait(shrunk, 60, "the group of three, member 3 out of the in-sync set")
    assert group.wait_writable(timeout=30) is not newcomer
    again = members_cli(group.members[2].addr, "remove", "--id", "3")
    assert again.returncode != 0 and "member 3 is not a member" in again.stderr, (
        f"{again.stdout}{again.stderr}")
    exit_code = newcomer.stop(timeout=60)
    timeline.add(f"stopped {newcomer}: exit code {exit_code}")
    acked = run.acked()
    wait_until(lambda: run.acked() >= acked + 200, 90, "200 sends acknowledged by the three")
    for m in group.members:
        listed, _ = status_members(m)
        assert listed == removed, f"{m} lists {listed}, the remove answered {removed}"

    report, failure = run.finish()
    print(run.timeline.text())
    assert failure is None, failure
    assert not report.violations(), report.summary()
    group.assert_no_panic()
    assert "panicked" not in newcomer.log_text(), newcomer.log_tail()


@pytest.mark.timeout(240)
def test_a_restart_with_other_group_members_is_refused_naming_both_lists(group):
    group.start()
    member = group.members[2]
    assert member.stop(timeout=60) == 0
    stored = member.members_arg
    wrong = f"{stored},3=127.0.0.1:{free_port()}"
    member.overrides["--group-members"] = wrong
    with pytest.raises(AssertionError):
        member.start()
    code = member.proc.wait(timeout=30)
    # What this start wrote (an error may come with a backtrace).
    text = member.log_text().rsplit("==== start", 1)[-1]
    assert code != 0, f"{member} started with --group-members {wrong}:\n{text}"
    assert MISMATCH in text and wrong in text and f"--group-members {stored}" in text, text

    # Started with the stored list, it rejoins.
    member.overrides.pop("--group-members")
    member.start()
    group.wait_rejoined(member, timeout=90)
    group.assert_no_panic()


@pytest.mark.timeout(480)
def test_a_member_is_replaced_under_load(membership_run):
    """`members replace` adds the new member, then removes the old one (the master here, so
    mastership moves away from it first): the group goes on as {0, 1, 3}."""
    run, newcomer = membership_run
    group, timeline = run.group, run.timeline
    run.start()
    old = group.members[2]
    master = group.wait_writable(timeout=60)
    if master is not old:
        code, remark = wire.switchover(master.addr, old.id, timeout_ms=3000)
        timeline.add(f"switchover {master} -> {old}: code {code} {remark}")
        assert code == wire.SUCCESS, remark
        assert group.wait_writable(timeout=30) is old, group.views()
    before = served_rows(old)

    newcomer.start(wipe=True)
    timeline.add(f"started {newcomer} with --group-members {newcomer.members_arg}")
    replaced = members_change(group.members[0].addr, "replace", "--id", str(old.id),
                              "--new-id", str(newcomer.id), "--address", newcomer.addr)
    timeline.add(f"members replace {old.id} by {newcomer.id} answered {replaced}")
    group.members.remove(old)
    group.members.append(newcomer)
    assert replaced == {m.id: m.addr for m in group.members}, replaced

    def caught_up():
        master = group.master()
        if master is None or master is old:
            return None
        listed, in_sync = status_members(master)
        rows = served_rows(newcomer)
        return (listed == replaced and in_sync == set(replaced) and rows is not None
                and rows >= before)
    group.wait(caught_up, 120, f"{newcomer} in sync in place of {old}, holding what {old} "
                               f"served before")
    exit_code = old.stop(timeout=60)
    timeline.add(f"stopped {old}: exit code {exit_code}")
    acked = run.acked()
    wait_until(lambda: run.acked() >= acked + 200, 90, "200 sends acknowledged by {0, 1, 3}")

    report, failure = run.finish()
    print(run.timeline.text())
    assert failure is None, failure
    assert not report.violations(), report.summary()
    group.assert_no_panic()
    assert "panicked" not in old.log_text(), old.log_tail()
