//! ACL signatures checked against Python's `hmac`, computed independently: Python reads the
//! encoded frames itself (JSON and binary ROCKETMQ headers), builds the signed content from
//! the extFields it finds and the body, and signs it. Needs `python3` (or `QUIVER_PYTHON`).

use bytes::{Bytes, BytesMut};
use quiver_protocol::acl::{self, Credentials};
use quiver_protocol::{frame, ExtFields, RemotingCommand, SerializeType};

const SECRET: &str = "secret-κλειδί-1";

/// Reads frames from stdin; prints, per frame, the signature it claims and the one Python
/// computes (Base64 HMAC-SHA1 over the sorted extFields values but Signature, then the body).
const PYTHON: &str = r#"
import base64, hashlib, hmac, json, struct, sys
secret = sys.argv[1].encode()
data = sys.stdin.buffer.read()
pos = 0
while pos < len(data):
    total, = struct.unpack_from(">i", data, pos)
    frame = data[pos + 4:pos + 4 + total]
    pos += 4 + total
    word, = struct.unpack_from(">i", frame, 0)
    kind, header_len = word >> 24, word & 0xFFFFFF
    header = frame[4:4 + header_len]
    body = frame[4 + header_len:]
    if kind == 0:
        ext = json.loads(header)["extFields"]
    else:
        at = 2 + 1 + 2 + 4 + 4
        remark_len, = struct.unpack_from(">i", header, at)
        at += 4 + remark_len
        ext_len, = struct.unpack_from(">i", header, at)
        at += 4
        end = at + ext_len
        ext = {}
        while at < end:
            key_len, = struct.unpack_from(">h", header, at)
            key = header[at + 2:at + 2 + key_len].decode()
            at += 2 + key_len
            value_len, = struct.unpack_from(">i", header, at)
            ext[key] = header[at + 4:at + 4 + value_len].decode()
            at += 4 + value_len
    content = "".join(ext[k] for k in sorted(ext) if k not in ("Signature", "_UNIQUE_KEY_QUERY"))
    digest = hmac.new(secret, content.encode() + body, hashlib.sha1).digest()
    print(kind, ext.get("Signature", "-"), base64.b64encode(digest).decode())
"#;

fn ext(pairs: &[(&str, &str)]) -> ExtFields {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn requests() -> Vec<RemotingCommand> {
    let send = RemotingCommand::request(
        10,
        ext(&[
            ("producerGroup", "PG"),
            ("topic", "Orders"),
            ("queueId", "3"),
            ("properties", "TAGS\u{1}A\u{2}KEYS\u{1}ключ\u{2}"),
            ("bornTimestamp", "1700000000000"),
        ]),
    )
    .with_body(Bytes::from_static(b"\x00\x01binary body \xff"));
    let route = RemotingCommand::request(105, ext(&[("topic", "Orders")]));
    let heartbeat = RemotingCommand::request(34, ExtFields::default())
        .with_body(Bytes::from_static(br#"{"clientID":"c1"}"#));
    vec![send, route, heartbeat]
}

#[test]
fn python_hmac_agrees_for_json_and_binary_headers() {
    let mut tokened = Credentials::new("alice12", SECRET);
    tokened.security_token = Some("session-token".into());
    let signers = [Credentials::new("alice12", SECRET), tokened];
    let mut wire = BytesMut::new();
    let mut expected = Vec::new();
    for serialize_type in [SerializeType::Json, SerializeType::RocketMq] {
        for signer in &signers {
            for mut request in requests() {
                request.serialize_type = serialize_type;
                signer.sign(&mut request);
                frame::encode(&request, &mut wire).expect("encodes");
                expected.push(acl::signature(&request, SECRET));
            }
        }
    }
    let computed = run_python(&wire);
    assert_eq!(computed.len(), expected.len(), "{computed:?}");
    for (index, (line, ours)) in computed.iter().zip(&expected).enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [kind, claimed, python] = fields[..] else {
            panic!("unexpected line {line}");
        };
        let kind = if kind == "0" { "JSON" } else { "binary" };
        assert_eq!(
            claimed, python,
            "frame {index} ({kind}): the signature sent"
        );
        assert_eq!(ours, python, "frame {index} ({kind}): acl::signature");
    }
}

fn run_python(frames: &[u8]) -> Vec<String> {
    use std::io::Write as _;
    let python = std::env::var("QUIVER_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = std::process::Command::new(&python)
        .args(["-c", PYTHON, SECRET])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("cannot run {python}: {error}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(frames)
        .expect("frames written");
    let output = child.wait_with_output().expect("python ran");
    assert!(output.status.success(), "python failed: {output:?}");
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect()
}
