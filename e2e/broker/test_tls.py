"""TLS on the remoting port, from outside the Rust code: Python's `ssl` module around a raw
socket that sends RocketMQ frames, in permissive mode (TLS and plain on one port) and
enforcing mode (a plain socket is closed, counted as tls-required); the `quiver` CLI with
--tls. Certificates come from `trustme`.

The stock `rocketmq` 0.4.4 client (Apache's C++ client) exposes no TLS setting, so it is
tested only as what it can be: a plain client of a permissive broker."""

import os
import ssl
import subprocess

import pytest
import trustme

import remoting
from clients import Collector, produce, start_consumer
from quiver_e2e import wait_until

TOPIC = "TlsTopic"


@pytest.fixture
def pki(tmp_path):
    """A CA, and a server certificate for localhost and 127.0.0.1, as cert-manager lays them out."""
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    paths = {name: str(tmp_path / name) for name in ("ca.crt", "tls.crt", "tls.key")}
    ca.cert_pem.write_to_path(paths["ca.crt"])
    server.cert_chain_pems[0].write_to_path(paths["tls.crt"])
    for extra in server.cert_chain_pems[1:]:
        extra.write_to_path(paths["tls.crt"], append=True)
    server.private_key_pem.write_to_path(paths["tls.key"])
    context = ssl.create_default_context(cafile=paths["ca.crt"])
    return paths, context


def tls_broker(make_broker, pki, mode):
    paths, _ = pki
    return make_broker(extra=[
        "--tls-mode", mode,
        "--tls-cert-file", paths["tls.crt"],
        "--tls-key-file", paths["tls.key"],
    ]).start()


def create_topic(addr, tls):
    fields = {"topic": TOPIC, "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    code, remark, _, _ = remoting.call(addr, remoting.UPDATE_AND_CREATE_TOPIC, fields, tls=tls)
    assert code == 0, remark


def broker_name(addr, tls=None):
    code, remark, _, body = remoting.call(addr, remoting.GET_BROKER_CONFIG, tls=tls)
    assert code == 0, remark
    properties = dict(line.split("=", 1) for line in body.decode().splitlines() if "=" in line)
    return properties["brokerName"]


def test_permissive_mode_answers_ssl_and_plain_frames(make_broker, pki):
    _, context = pki
    broker = tls_broker(make_broker, pki, "permissive")
    create_topic(broker.addr, context)
    assert remoting.route(broker.addr, TOPIC) == {"broker-0": 6}
    assert broker_name(broker.addr, context) == "broker-0"
    assert broker_name(broker.addr) == "broker-0"
    assert (broker.metric("quiver_connections_closed_total", reason="tls-required") or 0) == 0
    assert broker.stop() == 0


@pytest.mark.timeout(300)
def test_stock_client_works_plain_against_permissive_mode(make_broker, pki):
    _, context = pki
    broker = tls_broker(make_broker, pki, "permissive")
    create_topic(broker.addr, context)
    collector = Collector()
    consumer = start_consumer(broker.addr, "TlsGroup", TOPIC, collector)
    try:
        produce(broker.addr, TOPIC, range(20))
        wait_until(lambda: len(collector.distinct()) == 20, 90, "the 20 messages consumed")
    finally:
        consumer.shutdown()
    assert collector.distinct() == {f"k-{i}" for i in range(20)}
    # A TLS client on another connection meanwhile.
    assert broker_name(broker.addr, context) == "broker-0"
    assert broker.stop() == 0


def test_enforcing_mode_closes_a_plain_socket_and_serves_ssl(make_broker, pki):
    _, context = pki
    broker = tls_broker(make_broker, pki, "enforcing")
    with pytest.raises(ConnectionError):
        remoting.call(broker.addr, remoting.GET_BROKER_CONFIG)
    assert broker.metric("quiver_connections_closed_total", reason="tls-required") >= 1
    create_topic(broker.addr, context)
    assert broker_name(broker.addr, context) == "broker-0"
    # A client that does not trust the CA fails its handshake; the broker counts it.
    with pytest.raises(ssl.SSLError):
        remoting.call(broker.addr, remoting.GET_BROKER_CONFIG, tls=ssl.create_default_context())
    assert broker_name(broker.addr, context) == "broker-0"
    assert broker.stop() == 0


def test_cli_connects_with_tls(make_broker, pki):
    paths, context = pki
    broker = tls_broker(make_broker, pki, "enforcing")
    create_topic(broker.addr, context)
    cli = os.path.join(os.environ["QUIVER_BIN_DIR"], "quiver")

    def quiver(*args, env=None):
        return subprocess.run([cli, "--server", broker.addr, *args], capture_output=True, text=True,
                              timeout=60, env=dict(os.environ, **(env or {})))

    listed = quiver("--tls-ca-file", paths["ca.crt"], "--tls-server-name", "localhost", "topics", "list")
    assert listed.returncode == 0, listed.stderr
    assert TOPIC in listed.stdout
    from_env = quiver("topics", "list", env={"QUIVER_TLS": "true", "QUIVER_TLS_CA_FILE": paths["ca.crt"]})
    assert from_env.returncode == 0, from_env.stderr
    plain = quiver("topics", "list")
    assert plain.returncode == 3, plain.stderr
    assert broker.stop() == 0
