"""ACL with the stock client (PyPI rocketmq 0.4.4, `set_session_credentials`): signed produce
and consume work; a wrong secret, an account without PUB and a non-admin account calling an
admin code are refused with NO_PERMISSION (16) and the broker's remark, and nothing is stored
or changed (checked by the admin account afterwards)."""

import glob
import os
import subprocess
import sys

import pytest

import remoting
from clients import HERE, Collector, produce, start_consumer
from quiver_e2e import wait_until

TOPIC = "AclTopic"
GROUP = "AclGroup"
QUEUES = 4
PRODUCER = ("producer1", "producer-secret")
READER = ("reader001", "reader-secret")
ADMIN = ("operator1", "operator-secret")

ACCOUNTS = f"""
accounts:
  - accessKey: {PRODUCER[0]}
    secretKey: {PRODUCER[1]}
    defaultTopicPerm: DENY
    topicPerms:
      - {TOPIC}=PUB
  - accessKey: {READER[0]}
    secretKey: {READER[1]}
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - {TOPIC}=SUB
    groupPerms:
      - {GROUP}=SUB
  - accessKey: {ADMIN[0]}
    secretKey: {ADMIN[1]}
    admin: true
"""


def refused_send(namesrv, credentials, home):
    """Runs the stock producer with `credentials` in its own HOME; returns its C++ log."""
    done = subprocess.run(
        [sys.executable, os.path.join(HERE, "produce_main.py"), namesrv, TOPIC, "0", "1", *credentials],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, HOME=home),
    )
    # The client retries a refused send, then reports it as "No route info of this topic".
    assert done.returncode != 0, f"the send was not refused:\n{done.stdout}\n{done.stderr}"
    logs = glob.glob(os.path.join(home, "logs", "rocketmq-cpp", "*.log*"))
    assert logs, f"no C++ client log under {home}"
    text = ""
    for path in logs:
        with open(path, errors="replace") as f:
            text += f.read()
    return text


def stored(addr):
    """Messages in the topic, as the admin account reads the queues' max offsets."""
    total = 0
    for queue in range(QUEUES):
        code, remark, ext, _ = remoting.call(
            addr, remoting.GET_MAX_OFFSET, {"topic": TOPIC, "queueId": queue}, credentials=ADMIN
        )
        assert code == 0, remark
        total += int(ext["offset"])
    return total


def refusals(broker, reason):
    return broker.metric("quiver_acl_refusals_total", reason=reason) or 0


@pytest.mark.timeout(300)
def test_stock_client_under_acl(make_broker, data_dir):
    acl_file = os.path.join(data_dir, "plain_acl.yml")
    with open(acl_file, "w") as f:
        f.write(ACCOUNTS)
    broker = make_broker(extra=["--acl-file", acl_file]).start()
    addr = broker.addr
    code, remark, _, _ = remoting.call(
        addr,
        remoting.UPDATE_AND_CREATE_TOPIC,
        {"topic": TOPIC, "readQueueNums": QUEUES, "writeQueueNums": QUEUES, "perm": 6},
        credentials=ADMIN,
    )
    assert code == 0, remark

    collector = Collector()
    consumer = start_consumer(addr, GROUP, TOPIC, collector, credentials=READER)
    try:
        wait_until(
            lambda: (broker.metric("quiver_parked_pulls") or 0) >= QUEUES + 1,
            60,
            "the signed consumer to park pulls on every queue",
        )
        produce(addr, TOPIC, range(100), credentials=PRODUCER)
        wait_until(lambda: len(collector.distinct()) == 100, 90, "the 100 signed messages consumed")
    finally:
        consumer.shutdown()
    assert collector.distinct() == {f"k-{i}" for i in range(100)}
    assert stored(addr) == 100

    wrong_secret = refused_send(addr, (PRODUCER[0], "not-the-secret"), os.path.join(data_dir, "wrong"))
    assert "error code:16" in wrong_secret
    assert f'signature mismatch for access key "{PRODUCER[0]}"' in wrong_secret
    no_pub = refused_send(addr, READER, os.path.join(data_dir, "nopub"))
    assert "error code:16" in no_pub
    assert f'access key "{READER[0]}" has no PUB permission on topic "{TOPIC}"' in no_pub
    assert refusals(broker, "signature-mismatch") >= 1
    assert refusals(broker, "no-permission") >= 1

    # Admin codes from a non-admin account, over raw frames signed with Python's hmac.
    for request, ext, body in [
        (remoting.UPDATE_AND_CREATE_TOPIC, {"topic": "AclOther", "readQueueNums": 1, "writeQueueNums": 1, "perm": 6}, b""),
        (remoting.UPDATE_BROKER_CONFIG, {}, b"brokerPermission=4\n"),
    ]:
        code, remark, _, _ = remoting.call(addr, request, ext, body, credentials=READER)
        assert code == remoting.NO_PERMISSION, remark
        assert f'needs an admin account; access key "{READER[0]}" is not admin' in remark
    code, remark, _, _ = remoting.call(addr, remoting.UPDATE_BROKER_CONFIG, {}, b"brokerPermission=4\n")
    assert code == remoting.NO_PERMISSION and "no signature" in remark, remark
    assert refusals(broker, "admin-required") == 2

    # Nothing was stored or changed.
    assert stored(addr) == 100
    code, _, _, _ = remoting.call(addr, remoting.GET_ROUTEINFO_BY_TOPIC, {"topic": "AclOther"})
    assert code == 17, "AclOther was created"
    code, remark, _, body = remoting.call(addr, remoting.GET_BROKER_CONFIG, credentials=ADMIN)
    assert code == 0, remark
    assert "brokerPermission=6" in body.decode()
    assert broker.stop() == 0
