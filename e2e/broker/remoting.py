"""A minimal RocketMQ remoting client (JSON header frames) for admin calls in tests."""

import base64
import hashlib
import hmac
import json
import socket
import struct

GET_ROUTEINFO_BY_TOPIC = 105
UPDATE_AND_CREATE_TOPIC = 17
UPDATE_BROKER_CONFIG = 25
GET_BROKER_CONFIG = 26
GET_MAX_OFFSET = 30
NO_PERMISSION = 16


def sign(ext, body, access_key, secret_key):
    """extFields with AccessKey and the Signature RocketMQ's ACL hook computes: Base64
    HMAC-SHA1 over the values of the extFields (Signature left out) in key order, then the body."""
    signed = dict(ext, AccessKey=access_key)
    content = "".join(signed[key] for key in sorted(signed)).encode() + body
    digest = hmac.new(secret_key.encode(), content, hashlib.sha1).digest()
    signed["Signature"] = base64.b64encode(digest).decode()
    return signed


def _read_exact(sock, n):
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError("broker closed the connection")
        data += chunk
    return data


def call(addr, code, ext=None, body=b"", timeout=10, credentials=None):
    """Sends one request, signed when `credentials` is (access key, secret key); returns
    (code, remark, extFields, body)."""
    ext = {k: str(v) for k, v in (ext or {}).items()}
    if credentials:
        ext = sign(ext, body, *credentials)
    header = json.dumps({
        "code": code, "language": "PYTHON", "version": 0, "opaque": 1, "flag": 0,
        "remark": "", "extFields": ext,
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
