"""A minimal RocketMQ remoting client (JSON header frames) for admin calls in tests (shared by
the e2e suites: each run.sh puts e2e/common on PYTHONPATH)."""

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


def call(addr, code, ext=None, body=b"", timeout=10, credentials=None, tls=None):
    """Sends one request, signed when `credentials` is (access key, secret key), over TLS when
    `tls` is an ssl.SSLContext (for the name "localhost"); returns (code, remark, extFields, body)."""
    ext = {k: str(v) for k, v in (ext or {}).items()}
    if credentials:
        ext = sign(ext, body, *credentials)
    header = json.dumps({
        "code": code, "language": "PYTHON", "version": 0, "opaque": 1, "flag": 0,
        "remark": "", "extFields": ext,
    }).encode()
    host, port = addr.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as raw:
        sock = tls.wrap_socket(raw, server_hostname="localhost") if tls else raw
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


HEART_BEAT = 34
END_TRANSACTION = 37
CHECK_TRANSACTION_STATE = 39
FLAG_RESPONSE = 1
FLAG_ONEWAY = 2


class Connection:
    """One open remoting connection: requests, oneway frames, and the broker's own requests."""

    def __init__(self, addr, timeout=10):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        self.opaque = 0
        self.pushed = []

    def close(self):
        self.sock.close()

    def _write(self, code, ext, body, flag):
        self.opaque += 1
        header = json.dumps({
            "code": code, "language": "PYTHON", "version": 0, "opaque": self.opaque,
            "flag": flag, "remark": "", "extFields": {k: str(v) for k, v in ext.items()},
        }).encode()
        self.sock.sendall(struct.pack(">ii", 4 + len(header) + len(body), len(header)) + header + body)
        return self.opaque

    def read(self):
        """The next frame as (header dict, body); JSON headers only."""
        total, = struct.unpack(">i", _read_exact(self.sock, 4))
        frame = _read_exact(self.sock, total)
        mark = struct.unpack(">i", frame[:4])[0]
        assert mark >> 24 == 0, "the broker answered a JSON client with JSON headers"
        header_len = mark & 0xFFFFFF
        return json.loads(frame[4:4 + header_len]), frame[4 + header_len:]

    def call(self, code, ext=None, body=b""):
        """A request and its response (code, remark, extFields); requests met meanwhile are kept."""
        opaque = self._write(code, ext or {}, body, 0)
        while True:
            header, frame_body = self.read()
            if header.get("flag", 0) & FLAG_RESPONSE and header["opaque"] == opaque:
                return header["code"], header.get("remark"), header.get("extFields") or {}
            self.pushed.append((header, frame_body))

    def oneway(self, code, ext=None, body=b""):
        self._write(code, ext or {}, body, FLAG_ONEWAY)

    def next_request(self, code):
        """The next request of `code` the broker sends on this connection."""
        while True:
            if self.pushed:
                header, body = self.pushed.pop(0)
            else:
                header, body = self.read()
            if header["code"] == code and not header.get("flag", 0) & FLAG_RESPONSE:
                return header.get("extFields") or {}, body
