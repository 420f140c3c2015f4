//! Malformed input yields a typed FrameError, never a panic, and never waits for (or
//! allocates) the bytes of a frame whose declared length is out of bounds.

use bytes::{BufMut, Bytes, BytesMut};
use quiver_protocol::{
    frame, ExtFields, FrameError, RemotingCommand, SerializeType, MAX_FRAME_BYTES,
};

/// A frame with the given header-word fields and raw header bytes.
fn raw_frame(serialize_type: u8, header: &[u8], body: &[u8]) -> BytesMut {
    let mut buf = BytesMut::new();
    buf.put_u32((4 + header.len() + body.len()) as u32);
    buf.put_u32(u32::from(serialize_type) << 24 | header.len() as u32);
    buf.put_slice(header);
    buf.put_slice(body);
    buf
}

fn decode_err(mut buf: BytesMut) -> FrameError {
    match frame::decode(&mut buf) {
        Err(error) => error,
        Ok(outcome) => panic!("expected an error, got {outcome:?}"),
    }
}

#[test]
fn frame_over_16_mib_is_rejected_from_its_length_prefix_alone() {
    for declared in [MAX_FRAME_BYTES as u32 + 1, i32::MAX as u32] {
        let mut buf = BytesMut::new();
        buf.put_u32(declared);
        let capacity_before = buf.capacity();
        let error = frame::decode(&mut buf).unwrap_err();
        assert!(
            matches!(error, FrameError::TooLarge { declared_bytes, max_bytes }
                if declared_bytes == u64::from(declared) && max_bytes == MAX_FRAME_BYTES),
            "{error:?}"
        );
        assert_eq!(
            buf.capacity(),
            capacity_before,
            "nothing reserved for a refused frame"
        );
        assert_eq!(buf.len(), 4, "a refused frame is not consumed");
    }
    // Exactly the limit is fine: the decoder just waits for the bytes.
    let mut buf = BytesMut::new();
    buf.put_u32(MAX_FRAME_BYTES as u32);
    assert!(frame::decode(&mut buf).unwrap().is_none());
    assert_eq!(frame::frame_len(&buf).unwrap(), Some(MAX_FRAME_BYTES + 4));
}

#[test]
fn negative_and_too_short_lengths() {
    let mut buf = BytesMut::new();
    buf.put_i32(-1);
    assert!(matches!(
        decode_err(buf),
        FrameError::NegativeLength {
            field: "total_len",
            value: -1
        }
    ));
    for short in 0..4 {
        let mut buf = BytesMut::new();
        buf.put_i32(short);
        buf.put_slice(&[0; 8]);
        assert!(matches!(decode_err(buf), FrameError::TooShort { .. }));
    }
}

#[test]
fn header_length_past_the_frame() {
    let mut buf = BytesMut::new();
    buf.put_u32(10);
    buf.put_u32(100);
    buf.put_slice(&[b'{'; 6]);
    assert!(matches!(
        decode_err(buf),
        FrameError::HeaderPastFrame {
            header_len: 100,
            available: 6
        }
    ));
}

#[test]
fn unknown_serialize_type() {
    let buf = raw_frame(7, b"{}", b"");
    assert!(matches!(
        decode_err(buf),
        FrameError::UnknownSerializeType { value: 7 }
    ));
}

#[test]
fn invalid_json_header_is_an_error_and_the_stream_stays_in_sync() {
    let mut buf = raw_frame(0, b"{\"code\":10,", b"body");
    let good = RemotingCommand::request(34, ExtFields::default()).with_opaque(3);
    frame::encode(&good, &mut buf).unwrap();
    assert!(matches!(
        frame::decode(&mut buf),
        Err(FrameError::HeaderJson { .. })
    ));
    // The bad frame was consumed whole: the next one decodes.
    assert_eq!(frame::decode(&mut buf).unwrap().unwrap(), good);
}

#[test]
fn json_header_shape_errors() {
    assert!(matches!(
        decode_err(raw_frame(0, b"[1,2]", b"")),
        FrameError::HeaderNotObject
    ));
    assert!(matches!(
        decode_err(raw_frame(0, b"{\"opaque\":1}", b"")),
        FrameError::MissingHeaderField { field: "code" }
    ));
    assert!(matches!(
        decode_err(raw_frame(0, b"{\"code\":\"ten\"}", b"")),
        FrameError::InvalidHeaderField { field: "code", .. }
    ));
    assert!(matches!(
        decode_err(raw_frame(0, b"{\"code\":99999999999}", b"")),
        FrameError::InvalidHeaderField { field: "code", .. }
    ));
    assert!(matches!(
        decode_err(raw_frame(0, b"{\"code\":10,\"extFields\":[1]}", b"")),
        FrameError::InvalidHeaderField {
            field: "extFields",
            ..
        }
    ));
    assert!(matches!(
        decode_err(raw_frame(0, b"", b"")),
        FrameError::HeaderJson { .. }
    ));
}

/// A binary header with the given remark length word and extFields bytes.
fn binary_header(remark_len: i32, remark: &[u8], ext_len: i32, ext: &[u8]) -> Vec<u8> {
    let mut header = Vec::new();
    header.put_i16(10);
    header.put_u8(0);
    header.put_i16(1);
    header.put_i32(1);
    header.put_i32(0);
    header.put_i32(remark_len);
    header.put_slice(remark);
    header.put_i32(ext_len);
    header.put_slice(ext);
    header
}

#[test]
fn binary_header_length_errors() {
    let negative_remark = binary_header(-5, b"", 0, b"");
    assert!(matches!(
        decode_err(raw_frame(1, &negative_remark, b"")),
        FrameError::NegativeLength {
            field: "remark length",
            value: -5
        }
    ));
    let remark_past_header = binary_header(i32::MAX, b"abc", 0, b"");
    assert!(matches!(
        decode_err(raw_frame(1, &remark_past_header, b"")),
        FrameError::BinaryHeaderTruncated {
            field: "remark",
            ..
        }
    ));
    let ext_past_header = binary_header(0, b"", 1_000_000, b"\x00\x01k");
    assert!(matches!(
        decode_err(raw_frame(1, &ext_past_header, b"")),
        FrameError::BinaryHeaderTruncated {
            field: "extFields",
            ..
        }
    ));
    let negative_key = binary_header(0, b"", 2, &(-3i16).to_be_bytes());
    assert!(matches!(
        decode_err(raw_frame(1, &negative_key, b"")),
        FrameError::NegativeLength {
            field: "extFields key length",
            value: -3
        }
    ));
    let mut ext = Vec::new();
    ext.put_i16(1);
    ext.put_u8(b'k');
    ext.put_i32(-1);
    let negative_value = binary_header(0, b"", ext.len() as i32, &ext);
    assert!(matches!(
        decode_err(raw_frame(1, &negative_value, b"")),
        FrameError::NegativeLength {
            field: "extFields value length",
            ..
        }
    ));
    let bad_utf8 = binary_header(2, &[0xff, 0xfe], 0, b"");
    assert!(matches!(
        decode_err(raw_frame(1, &bad_utf8, b"")),
        FrameError::InvalidUtf8 {
            field: "remark",
            ..
        }
    ));
    let truncated = &binary_header(0, b"", 0, b"")[..7];
    assert!(matches!(
        decode_err(raw_frame(1, truncated, b"")),
        FrameError::BinaryHeaderTruncated {
            field: "opaque",
            ..
        }
    ));
}

#[test]
fn encoding_more_than_16_mib_is_refused() {
    let command = RemotingCommand::request(10, ExtFields::default())
        .with_body(Bytes::from(vec![0u8; MAX_FRAME_BYTES]));
    let mut buf = BytesMut::new();
    assert!(matches!(
        frame::encode(&command, &mut buf),
        Err(FrameError::TooLarge { .. })
    ));
    assert!(buf.is_empty());
    let huge_remark =
        RemotingCommand::request(10, ExtFields::default()).with_remark("r".repeat(1 << 24));
    assert!(matches!(
        frame::encode(&huge_remark, &mut buf),
        Err(FrameError::HeaderTooLarge { .. })
    ));
    let binary = RemotingCommand::request(40_000, ExtFields::default())
        .with_serialize_type(SerializeType::RocketMq);
    assert!(matches!(
        frame::encode(&binary, &mut buf),
        Err(FrameError::InvalidHeaderField { field: "code", .. })
    ));
}
