"""A minimal RocketMQ remoting client (JSON header frames) for admin calls in tests."""

import json
import socket
import struct

GET_ROUTEINFO_BY_TOPIC = 105
UPDATE_AND_CREATE_TOPIC = 17
UPDATE_BROKER_CONFIG = 25


def _read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def call(addr, code, ext=None, body=b"", timeout=10):
    """Sends one request; returns (code, remark, extFields, body)."""
    header = json.dumps({
        "code": code, "language": "PYTHON", "version": 0, "opaque": 1, "flag": 0,
        "remark": "", "extFields": {k: str(v) for k, v in (ext or {}).items()},
    }).encode()
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body)
        total, = struct.unpack(">i", _read_exact(sock, 4))
        frame = _read_exact(sock, total)
    header_len = struct.unpack(">i", frame[:4])[0] & 0xFFFFFF
    reply = json.loads(frame[4:4 + header_len])
    return reply["code"], reply.get("remark"), reply.get("extFields") or {}, frame[4 + header_len:]


def route(addr, topic):
    """{brokerName: perm} of the topic's route as `addr` answers it."""
    code, remark, _, body = call(addr, GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
    assert code == 0, remark
    data = json.loads(body)
    return {q["brokerName"]: q["perm"] for q in data["queueDatas"]}
