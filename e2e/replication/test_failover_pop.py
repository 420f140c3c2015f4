"""5.x POP (SimpleConsumer receive and ack) across a failover: receipt handles issued by the
old master ack on the new one, a message acked before the kill -9 is never delivered again,
one acked after the failover neither, and one never acked comes back.

The suite's python holds the 4.x client (package `rocketmq`); the 5.x client's package of the
same name lives in e2e/grpc's venv (.venv-grpc, made by e2e/grpc/run.sh). So this file is
also the gRPC driver: run by that venv's python as a script, it makes one raw ReceiveMessage or
AckMessage call (the calls a SimpleConsumer makes, aimed at the member we name, where the
client would follow the route) and prints the answer as JSON."""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
GRPC_PYTHON = os.environ.get(
    "QUIVER_GRPC_PYTHON", os.path.join(HERE, "..", "grpc", ".venv-grpc", "bin", "python"))
TOPIC = "PopFailoverTopic"
GROUP = "pop-failover-readers"
QUEUES = 2
MESSAGES = 30
# Long enough that every message received before the kill is still in flight after the
# failover; the last phase receives for longer than this.
INVISIBLE_SECONDS = 45
# Seconds a receive long-polls on the broker.
LONG_POLL_SECONDS = 2
CALL_TIMEOUT_SECONDS = 15


# ---- the driver (run by .venv-grpc's python) ----

def _receive(stub, pb, payload):
    service, definition, duration = pb
    request = service.ReceiveMessageRequest(
        group=definition.Resource(name=payload["group"]),
        message_queue=definition.MessageQueue(topic=definition.Resource(name=payload["topic"])),
        filter_expression=definition.FilterExpression(type=definition.TAG, expression="*"),
        batch_size=payload["batch"],
        invisible_duration=duration(seconds=payload["invisible"]),
        long_polling_timeout=duration(seconds=LONG_POLL_SECONDS),
    )
    status, messages = None, []
    for response in stub.ReceiveMessage(request, timeout=CALL_TIMEOUT_SECONDS):
        if response.HasField("status"):
            status = response.status
        if response.HasField("message"):
            props = response.message.system_properties
            messages.append({"body": response.message.body.decode(), "id": props.message_id,
                             "handle": props.receipt_handle, "attempt": props.delivery_attempt})
    return {"code": definition.Code.Name(status.code) if status else None,
            "message": status.message if status else "", "messages": messages}


def _ack(stub, pb, payload):
    service, definition, _ = pb
    request = service.AckMessageRequest(
        group=definition.Resource(name=payload["group"]),
        topic=definition.Resource(name=payload["topic"]),
        entries=[service.AckMessageEntry(message_id=e["id"], receipt_handle=e["handle"])
                 for e in payload["entries"]],
    )
    response = stub.AckMessage(request, timeout=CALL_TIMEOUT_SECONDS)
    return {"code": definition.Code.Name(response.status.code), "message": response.status.message,
            "entries": [{"id": e.message_id, "code": definition.Code.Name(e.status.code),
                         "message": e.status.message} for e in response.entries]}


def _drive(action, endpoint):
    import grpc
    from google.protobuf.duration_pb2 import Duration
    from rocketmq.grpc_protocol import definition_pb2, service_pb2, service_pb2_grpc

    payload = json.load(sys.stdin)
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        call = {"receive": _receive, "ack": _ack}[action]
        try:
            answer = call(stub, (service_pb2, definition_pb2, Duration), payload)
        except grpc.RpcError as error:
            answer = {"code": f"grpc {error.code().name}", "message": error.details() or ""}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    _drive(sys.argv[1], sys.argv[2])
    sys.exit(0)


# ---- the test (run by the suite's pytest) ----

import remoting  # noqa: E402
import wire  # noqa: E402
from quiver_e2e import free_port, wait_until  # noqa: E402

GET_ALL_TOPIC_CONFIG = 21
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201


def grpc_call(endpoint, action, payload):
    assert os.access(GRPC_PYTHON, os.X_OK), (
        f"{GRPC_PYTHON} is missing: run e2e/grpc/run.sh once (it makes the 5.x client's venv) "
        "or point QUIVER_GRPC_PYTHON at a python with rocketmq-python-client")
    done = subprocess.run([GRPC_PYTHON, os.path.abspath(__file__), action, endpoint],
                          input=json.dumps(payload), capture_output=True, text=True,
                          timeout=CALL_TIMEOUT_SECONDS + 30)
    assert done.returncode == 0, f"{action} on {endpoint}: {done.stdout}\n{done.stderr}"
    return json.loads(done.stdout)


def receive(endpoint, invisible=INVISIBLE_SECONDS, refusals=None):
    """The messages one receive handed out; [] when the call failed (a member not yet
    serving), which the caller's polling covers; a failed call's code is counted in
    `refusals`."""
    answer = grpc_call(endpoint, "receive", {"group": GROUP, "topic": TOPIC, "batch": 32,
                                             "invisible": invisible})
    if refusals is not None and answer["code"] not in (None, "OK", "MESSAGE_NOT_FOUND"):
        key = f"{answer['code']}: {answer['message']}"
        refusals[key] = refusals.get(key, 0) + 1
    return answer.get("messages", [])


def ack(endpoint, entries, timeout=60):
    """Acks `entries`, retrying those not acked while the deadline lasts (a new master may
    still be taking over); {message id: (code, message)} of each entry's last answer."""
    results = {}
    pending = list(entries)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        answer = grpc_call(endpoint, "ack", {"group": GROUP, "topic": TOPIC, "entries": pending})
        for e in answer.get("entries", []):
            results[e["id"]] = (e["code"], e["message"])
        if "entries" not in answer:
            for e in pending:
                results[e["id"]] = (answer["code"], answer["message"])
        pending = [e for e in pending if results[e["id"]][0] != "OK"]
        if pending:
            time.sleep(1)
    return results


def start_group_with_grpc(group):
    """The suite's group with each member's gRPC port on a free loopback port."""
    endpoints = {}
    for m in group.members:
        endpoints[m.id] = f"127.0.0.1:{free_port()}"
        m.overrides["--grpc-listen"] = endpoints[m.id]
        m.overrides["--grpc-advertise"] = endpoints[m.id]
    group.start()
    return endpoints


def create_topic_and_group(group, master):
    """The topic and the subscription group on the master, then on every replica: replicas
    copy the master's topics and groups every second, and a member that becomes master
    before its copy lacks them (the copy interval the test waits out)."""
    wire.create_topic(master.addr, TOPIC, queues=QUEUES)
    body = json.dumps({"groupName": GROUP, "consumeEnable": True, "retryMaxTimes": 16,
                       "retryQueueNums": 1}).encode()
    code, remark, _, _ = remoting.call(master.addr, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, body=body)
    assert code == 0, f"create group {GROUP} on {master}: code {code} {remark}"
    wire.commit_offsets(master.addr, GROUP, TOPIC, QUEUES, 0)
    for m in group.members:
        group.wait(lambda: knows(m, GET_ALL_TOPIC_CONFIG, TOPIC), 60, f"{m} to copy {TOPIC}")
        group.wait(lambda: knows(m, GET_ALL_SUBSCRIPTIONGROUP_CONFIG, GROUP), 60,
                   f"{m} to copy {GROUP}")


def knows(member, request_code, name):
    try:
        code, _, _, body = remoting.call(member.addr, request_code, timeout=5)
    except OSError:
        return False
    return code == 0 and f'"{name}"' in (body or b"").decode(errors="replace")


def produce(master):
    bodies = [f"pop-{i}" for i in range(MESSAGES)]
    for i, body in enumerate(bodies):
        code, remark, _, _ = wire.send(master.addr, TOPIC, body, body, queue_id=i % QUEUES)
        assert code == wire.SUCCESS, f"send {body} to {master}: code {code} {remark}"
    return bodies


def receive_in_flight(endpoint, count):
    """Receives until `count` distinct messages are in flight; {body: message}."""
    got = {}
    def all_received():
        for m in receive(endpoint):
            assert m["body"] not in got, f"{m['body']} delivered twice within its invisible time"
            got[m["body"]] = m
        return len(got) == count
    wait_until(all_received, 60, f"{count} messages received")
    return got


def test_pop_messages_in_flight_across_a_failover_are_delivered_once(group):
    endpoints = start_group_with_grpc(group)
    master = group.wait_writable(timeout=30)
    old_epoch = master.view()[1]
    create_topic_and_group(group, master)
    bodies = produce(master)
    group.wait_in_sync(len(group.members), timeout=60)

    in_flight = receive_in_flight(endpoints[master.id], MESSAGES)
    received_at = time.monotonic()
    acked_before = {b for i, b in enumerate(bodies) if i % 3 == 0}
    acked_after = {b for i, b in enumerate(bodies) if i % 3 == 1}
    never_acked = {b for i, b in enumerate(bodies) if i % 3 == 2}
    results = ack(endpoints[master.id], [in_flight[b] for b in sorted(acked_before)])
    refused = {i: r for i, r in results.items() if r[0] != "OK"}
    assert not refused, f"acks refused by the master before the kill: {refused}"

    master.kill9()
    new_master = group.wait_writable(exclude=(master.id,), min_epoch=old_epoch + 1, timeout=90)
    print(f"\nfailover: {master} killed, {new_master} master")

    # The old master's handles: the new master holds their POP state (the state log), so it
    # accepts them.
    results = ack(endpoints[new_master.id], [in_flight[b] for b in sorted(acked_after)], timeout=90)
    refused = {i: r for i, r in results.items() if r[0] != "OK"}
    print(f"acked after the failover: {len(results) - len(refused)} of {len(acked_after)} accepted")
    assert not refused, f"handles issued before the failover refused by the new master: {refused}"

    refusals = {}
    again = redeliveries(endpoints[new_master.id], received_at, never_acked, refusals)
    print(f"receives refused by the new master: {refusals or 'none'}")
    counts = {b: sum(1 for m in again if m["body"] == b) for b in bodies}
    print(f"{MESSAGES} messages in flight at the kill: {len(acked_before)} acked before it, "
          f"{len(acked_after)} after the failover, {len(never_acked)} never; delivered again: "
          f"{sum(counts[b] for b in acked_before)} acked before, "
          f"{sum(counts[b] for b in acked_after)} acked after, "
          f"{sum(counts[b] for b in never_acked)} of the never acked "
          f"({sum(1 for b in never_acked if counts[b])} distinct)")
    assert not [b for b in acked_before if counts[b]], "acked before the kill, delivered again"
    assert not [b for b in acked_after if counts[b]], "acked after the failover, delivered again"
    assert not [b for b in never_acked if counts[b] == 0], "never acked, not delivered again"
    assert not [b for b in never_acked if counts[b] > 1], "acked on redelivery, delivered again"
    group.assert_no_panic()


def redeliveries(endpoint, received_at, expected, refusals):
    """Receives (acking each message) until every body of `expected` came back and the
    original invisible time has passed with margin; every message delivered meanwhile."""
    got = []
    def done():
        for m in receive(endpoint, invisible=60, refusals=refusals):
            got.append(m)
            ack(endpoint, [m])
        seen = {m["body"] for m in got}
        return expected <= seen and time.monotonic() > received_at + INVISIBLE_SECONDS + 20
    try:
        wait_until(done, INVISIBLE_SECONDS + 240, "the never-acked messages to come back")
    except AssertionError:
        pass  # what did come back is judged by the caller's assertions, with the counts
    return got
