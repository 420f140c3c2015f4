"""The `quiver` CLI: help everywhere, listings, and the documented exit codes."""

import pytest

from conftest import Quiver
from quiver_e2e import free_port

COMMANDS = [[], ["produce"], ["consume"], ["topics"], ["topics", "list"], ["topics", "create"],
            ["topics", "route"], ["lag"], ["offsets"], ["offsets", "reset"], ["cluster"],
            ["message"]]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "quiver")
def test_every_command_has_help(quiver, command):
    out = quiver.run(*command, "--help").stdout
    assert "Usage:" in out


def test_topics_cluster_and_route_listings(broker, quiver):
    quiver.create_topic("cli-topic", 3)
    topics = {t["name"]: t for t in quiver.json("topics", "list")}
    assert topics["cli-topic"]["write_queue_nums"] == 3
    brokers = quiver.json("cluster")
    assert [b["addr"] for b in brokers] == [broker.addr]
    assert brokers[0]["state"]["state"] == "up"
    route = quiver.json("topics", "route", "cli-topic")
    assert len(route["write_queues"]) == 3
    table = quiver.run("topics", "list").stdout
    assert "cli-topic" in table and "READ_QUEUES" in table


def test_produce_from_stdin_then_count(quiver):
    quiver.create_topic("cli-stdin", 2)
    quiver.run("produce", "--topic", "cli-stdin", "--quiet", stdin="a\nb\nc\n")
    out = quiver.run("consume", "--topic", "cli-stdin", "--group", "cli-counter", "--from", "first",
                     "--mode", "count", "--max", "3", "--idle-timeout-secs", "30").stdout
    assert out.strip() == "3"


def test_unreachable_server_exits_3(quiver):
    result = Quiver(f"127.0.0.1:{free_port()}").run("topics", "list", check=False)
    assert result.returncode == 3, result.stderr
    assert "cannot connect" in result.stderr


def test_bad_arguments_exit_2(quiver):
    result = quiver.run("consume", "--topic", "t", "--from", "yesterday", check=False)
    assert result.returncode == 2
    assert "expected first, last" in result.stderr


def test_lag_of_unknown_group_is_unknown_not_zero(quiver):
    quiver.create_topic("cli-lag", 2)
    quiver.run("produce", "--topic", "cli-lag", "x", "y")
    lag = quiver.json("lag", "--group", "nobody", "--topic", "cli-lag")
    assert all(q["lag_messages"] is None for q in lag), lag


def test_missing_input_file_exits_1(quiver):
    result = quiver.run("produce", "--topic", "t", "--file", "/nonexistent/file", check=False)
    assert result.returncode == 1
    assert "cannot read /nonexistent/file" in result.stderr
