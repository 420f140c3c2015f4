//! Frame encode/decode.
//!
//! ```text
//! i32 total_len                          counts every byte after this field
//! i32 (serialize_type << 24 | header_len)
//! header                                 JSON object, or the binary ROCKETMQ header
//! body
//! ```
//! Every length is checked against the bytes actually present before anything is allocated.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use serde_json::Value;

use crate::command::{language_code, language_name, ExtFields, RemotingCommand, SerializeType};
use crate::error::FrameError;
use crate::MAX_FRAME_BYTES;

/// Bytes of the `total_len` prefix.
const LENGTH_PREFIX_BYTES: usize = 4;
/// Bytes of the header-length word.
const HEADER_WORD_BYTES: usize = 4;
/// The header length occupies the low 24 bits of its word.
const MAX_HEADER_BYTES: usize = (1 << 24) - 1;

/// Validates the length prefix at the start of `buf` and returns the whole frame's size in
/// bytes (prefix included), or `Ok(None)` when fewer than 4 bytes are buffered. Callers may
/// reserve this much before reading: it is already bounded by [`MAX_FRAME_BYTES`].
pub fn frame_len(buf: &[u8]) -> Result<Option<usize>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_PREFIX_BYTES) else {
        return Ok(None);
    };
    let total_len = i32::from_be_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]);
    let total_len = usize::try_from(total_len).map_err(|_| FrameError::NegativeLength {
        field: "total_len",
        value: i64::from(total_len),
    })?;
    if total_len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            declared_bytes: total_len as u64,
            max_bytes: MAX_FRAME_BYTES,
        });
    }
    if total_len < HEADER_WORD_BYTES {
        return Err(FrameError::TooShort { total_len });
    }
    Ok(Some(LENGTH_PREFIX_BYTES + total_len))
}

/// Decodes one frame from the front of `buf`.
///
/// `Ok(None)` means more bytes are needed and `buf` is untouched. A bad length prefix
/// (negative, under 4, over [`MAX_FRAME_BYTES`]) is an error that consumes nothing: the stream
/// cannot be resynchronised, so close the connection. Otherwise exactly one frame is consumed,
/// also when its header then fails to parse. The body is a zero-copy view of `buf`'s storage.
pub fn decode(buf: &mut BytesMut) -> Result<Option<RemotingCommand>, FrameError> {
    let Some(frame_bytes) = frame_len(buf)? else {
        return Ok(None);
    };
    if buf.len() < frame_bytes {
        return Ok(None);
    }
    let mut frame = buf.split_to(frame_bytes).freeze();
    frame.advance(LENGTH_PREFIX_BYTES);
    let header_word = frame.get_u32();
    let serialize_wire = (header_word >> 24) as u8;
    let header_len = (header_word & 0x00FF_FFFF) as usize;
    if header_len > frame.len() {
        return Err(FrameError::HeaderPastFrame {
            header_len,
            available: frame.len(),
        });
    }
    let serialize_type =
        SerializeType::from_wire(serialize_wire).ok_or(FrameError::UnknownSerializeType {
            value: serialize_wire,
        })?;
    let header = frame.split_to(header_len);
    let body = frame;
    let mut command = match serialize_type {
        SerializeType::Json => decode_json_header(&header)?,
        SerializeType::RocketMq => decode_binary_header(&header)?,
    };
    command.body = body;
    command.serialize_type = serialize_type;
    Ok(Some(command))
}

/// Appends `cmd` as one frame to `dst`, using the command's own serialize type.
pub fn encode(cmd: &RemotingCommand, dst: &mut BytesMut) -> Result<(), FrameError> {
    let (header, total_len) = checked_header(cmd)?;
    // The whole frame at once, so the body's copy never moves the head.
    dst.reserve(LENGTH_PREFIX_BYTES + total_len);
    put_head(cmd, &header, total_len, dst);
    dst.put_slice(&cmd.body);
    for part in &cmd.body_chain {
        dst.put_slice(part);
    }
    Ok(())
}

/// Appends the start of `cmd`'s frame to `dst`: everything but the body, which the caller
/// sends right after (`body`, then `body_chain`), e.g. with a vectored write.
pub fn encode_head(cmd: &RemotingCommand, dst: &mut BytesMut) -> Result<(), FrameError> {
    let (header, total_len) = checked_header(cmd)?;
    dst.reserve(LENGTH_PREFIX_BYTES + HEADER_WORD_BYTES + header.len());
    put_head(cmd, &header, total_len, dst);
    Ok(())
}

/// The encoded header and the frame's length after its length prefix, both within limits.
fn checked_header(cmd: &RemotingCommand) -> Result<(Vec<u8>, usize), FrameError> {
    let header = match cmd.serialize_type {
        SerializeType::Json => encode_json_header(cmd)?,
        SerializeType::RocketMq => encode_binary_header(cmd)?,
    };
    if header.len() > MAX_HEADER_BYTES {
        return Err(FrameError::HeaderTooLarge {
            header_len: header.len(),
            max_bytes: MAX_HEADER_BYTES,
        });
    }
    let total_len = HEADER_WORD_BYTES + header.len() + cmd.body_len();
    if total_len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge {
            declared_bytes: total_len as u64,
            max_bytes: MAX_FRAME_BYTES,
        });
    }
    Ok((header, total_len))
}

fn put_head(cmd: &RemotingCommand, header: &[u8], total_len: usize, dst: &mut BytesMut) {
    // Both casts are lossless: total_len <= MAX_FRAME_BYTES and header.len() < 2^24.
    dst.put_u32(total_len as u32);
    dst.put_u32(u32::from(cmd.serialize_type.wire_value()) << 24 | header.len() as u32);
    dst.put_slice(header);
}

/// Encodes `cmd` into a fresh buffer holding exactly one frame.
pub fn encode_to_bytes(cmd: &RemotingCommand) -> Result<Bytes, FrameError> {
    let mut dst = BytesMut::new();
    encode(cmd, &mut dst)?;
    Ok(dst.freeze())
}

/// The JSON header as Apache writes it (fastjson): its keys, in fastjson's alphabetical order,
/// and no remark when there is none.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonHeaderOut<'a> {
    code: i32,
    ext_fields: &'a ExtFields,
    flag: i32,
    language: &'a str,
    opaque: i32,
    #[serde(skip_serializing_if = "Option::is_none")]
    remark: Option<&'a str>,
    /// Apache's spelling: clients that look the key up by name miss `...Rpc`.
    #[serde(rename = "serializeTypeCurrentRPC")]
    serialize_type_current_rpc: &'static str,
    version: i32,
}

fn encode_json_header(cmd: &RemotingCommand) -> Result<Vec<u8>, FrameError> {
    let header = JsonHeaderOut {
        code: cmd.code,
        ext_fields: &cmd.ext_fields,
        flag: cmd.flag,
        language: &cmd.language,
        opaque: cmd.opaque,
        remark: cmd.remark.as_deref().filter(|remark| !remark.is_empty()),
        serialize_type_current_rpc: "JSON",
        version: cmd.version,
    };
    serde_json::to_vec(&header).map_err(|source| FrameError::EncodeJson { source })
}

/// The JSON header as read: scalars kept as (allocation-free for numbers) JSON values so
/// their type errors can name the field; extFields straight into strings.
#[derive(serde::Deserialize)]
struct JsonHeaderIn {
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    language: Option<Value>,
    #[serde(default)]
    version: Option<Value>,
    #[serde(default)]
    opaque: Option<Value>,
    #[serde(default)]
    flag: Option<Value>,
    #[serde(default)]
    remark: Option<Value>,
    #[serde(default, rename = "extFields")]
    ext_fields: Option<ExtFieldsIn>,
}

/// extFields: an object whose values peers send as strings, numbers or booleans.
enum ExtFieldsIn {
    Fields(ExtFields),
    /// Not an object: kept (as JSON text) to name it in the error.
    Invalid(String),
}

impl<'de> serde::Deserialize<'de> for ExtFieldsIn {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value_or_map = deserializer.deserialize_any(ExtFieldsVisitor)?;
        Ok(value_or_map)
    }
}

struct ExtFieldsVisitor;

impl<'de> serde::de::Visitor<'de> for ExtFieldsVisitor {
    type Value = ExtFieldsIn;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("an extFields object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ExtFieldsIn, A::Error> {
        let mut fields = ExtFields::with_capacity(map.size_hint().unwrap_or(16).min(64));
        while let Some(key) = map.next_key::<String>()? {
            if let ExtValueIn(Some(value)) = map.next_value()? {
                fields.push_decoded(&key, &value);
            }
        }
        Ok(ExtFieldsIn::Fields(fields))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<ExtFieldsIn, A::Error> {
        use serde::Deserialize;
        let value = Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
        Ok(ExtFieldsIn::Invalid(value.to_string()))
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ExtFieldsIn, E> {
        Ok(ExtFieldsIn::Invalid(
            Value::String(text.to_owned()).to_string(),
        ))
    }

    fn visit_bool<E: serde::de::Error>(self, flag: bool) -> Result<ExtFieldsIn, E> {
        Ok(ExtFieldsIn::Invalid(flag.to_string()))
    }

    fn visit_i64<E: serde::de::Error>(self, number: i64) -> Result<ExtFieldsIn, E> {
        Ok(ExtFieldsIn::Invalid(number.to_string()))
    }

    fn visit_u64<E: serde::de::Error>(self, number: u64) -> Result<ExtFieldsIn, E> {
        Ok(ExtFieldsIn::Invalid(number.to_string()))
    }

    fn visit_f64<E: serde::de::Error>(self, number: f64) -> Result<ExtFieldsIn, E> {
        Ok(ExtFieldsIn::Invalid(number.to_string()))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<ExtFieldsIn, E> {
        Ok(ExtFieldsIn::Fields(ExtFields::default()))
    }
}

/// One extFields value as a string; `None` for null (the key is then dropped).
struct ExtValueIn(Option<String>);

impl<'de> serde::Deserialize<'de> for ExtValueIn {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(ExtValueVisitor)
    }
}

struct ExtValueVisitor;

impl<'de> serde::de::Visitor<'de> for ExtValueVisitor {
    type Value = ExtValueIn;

    fn expecting(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("a string, number, boolean or null")
    }

    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<ExtValueIn, E> {
        Ok(ExtValueIn(Some(text.to_owned())))
    }

    fn visit_string<E: serde::de::Error>(self, text: String) -> Result<ExtValueIn, E> {
        Ok(ExtValueIn(Some(text)))
    }

    fn visit_bool<E: serde::de::Error>(self, flag: bool) -> Result<ExtValueIn, E> {
        Ok(ExtValueIn(Some(flag.to_string())))
    }

    fn visit_i64<E: serde::de::Error>(self, number: i64) -> Result<ExtValueIn, E> {
        Ok(ExtValueIn(Some(number.to_string())))
    }

    fn visit_u64<E: serde::de::Error>(self, number: u64) -> Result<ExtValueIn, E> {
        Ok(ExtValueIn(Some(number.to_string())))
    }

    fn visit_f64<E: serde::de::Error>(self, number: f64) -> Result<ExtValueIn, E> {
        Ok(ExtValueIn(Some(Value::from(number).to_string())))
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<ExtValueIn, E> {
        Ok(ExtValueIn(None))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<ExtValueIn, A::Error> {
        use serde::Deserialize;
        let nested = Value::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
        Ok(ExtValueIn(Some(nested.to_string())))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<ExtValueIn, A::Error> {
        use serde::Deserialize;
        let nested = Value::deserialize(serde::de::value::SeqAccessDeserializer::new(seq))?;
        Ok(ExtValueIn(Some(nested.to_string())))
    }
}

fn decode_json_header(header: &[u8]) -> Result<RemotingCommand, FrameError> {
    let starts_as_object = header
        .iter()
        .find(|byte| !byte.is_ascii_whitespace())
        .is_some_and(|&byte| byte == b'{');
    if !starts_as_object {
        // Tell "valid JSON but not an object" from "not JSON at all".
        return Err(match serde_json::from_slice::<Value>(header) {
            Ok(_) => FrameError::HeaderNotObject,
            Err(source) => FrameError::HeaderJson { source },
        });
    }
    let parsed: JsonHeaderIn =
        serde_json::from_slice(header).map_err(|source| FrameError::HeaderJson { source })?;
    let code = json_i32(parsed.code.as_ref(), "code")?
        .ok_or(FrameError::MissingHeaderField { field: "code" })?;
    let language = match parsed.language {
        Some(Value::String(name)) => name,
        Some(Value::Number(number)) => number
            .as_u64()
            .and_then(|ordinal| u8::try_from(ordinal).ok())
            .map(language_name)
            .unwrap_or("OTHER")
            .to_owned(),
        _ => "OTHER".to_owned(),
    };
    // Peers send "" for no remark; the binary header cannot tell the two apart either.
    let remark = match parsed.remark {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) if text.is_empty() => None,
        Some(Value::String(text)) => Some(text),
        Some(other) => Some(other.to_string()),
    };
    let ext_fields = match parsed.ext_fields {
        None => ExtFields::default(),
        Some(ExtFieldsIn::Fields(fields)) => fields,
        Some(ExtFieldsIn::Invalid(text)) => {
            return Err(FrameError::InvalidHeaderField {
                field: "extFields",
                value: truncate_for_error(&text),
            })
        }
    };
    Ok(RemotingCommand {
        code,
        language,
        version: json_i32(parsed.version.as_ref(), "version")?.unwrap_or(0),
        opaque: json_i32(parsed.opaque.as_ref(), "opaque")?.unwrap_or(0),
        flag: json_i32(parsed.flag.as_ref(), "flag")?.unwrap_or(0),
        remark,
        ext_fields,
        body: Bytes::new(),
        body_chain: Vec::new(),
        serialize_type: SerializeType::Json,
    })
}

/// An integer header field sent as a JSON number or a numeric string.
fn json_i32(value: Option<&Value>, field: &'static str) -> Result<Option<i32>, FrameError> {
    let invalid = |value: &Value| FrameError::InvalidHeaderField {
        field,
        value: truncate_for_error(&value.to_string()),
    };
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(value @ Value::Number(number)) => number
            .as_i64()
            .and_then(|wide| i32::try_from(wide).ok())
            .map(Some)
            .ok_or_else(|| invalid(value)),
        Some(value @ Value::String(text)) => {
            text.trim().parse().map(Some).map_err(|_| invalid(value))
        }
        Some(other) => Err(invalid(other)),
    }
}

/// Error messages quote at most this many characters of a bad value.
fn truncate_for_error(text: &str) -> String {
    text.chars().take(120).collect()
}

fn encode_binary_header(cmd: &RemotingCommand) -> Result<Vec<u8>, FrameError> {
    let code = i16::try_from(cmd.code).map_err(|_| FrameError::InvalidHeaderField {
        field: "code",
        value: cmd.code.to_string(),
    })?;
    let version = i16::try_from(cmd.version).map_err(|_| FrameError::InvalidHeaderField {
        field: "version",
        value: cmd.version.to_string(),
    })?;
    let remark = cmd.remark.as_deref().unwrap_or("").as_bytes();
    // Sized first, so the header is written into one allocation.
    let mut ext_len = 0usize;
    for (key, value) in cmd.ext_fields.iter_bytes() {
        i16::try_from(key.len()).map_err(|_| FrameError::FieldTooLong {
            field: "extFields key",
            len: key.len(),
        })?;
        i32::try_from(value.len()).map_err(|_| FrameError::FieldTooLong {
            field: "extFields value",
            len: value.len(),
        })?;
        ext_len += 2 + key.len() + 4 + value.len();
    }
    let remark_len = i32::try_from(remark.len()).map_err(|_| FrameError::FieldTooLong {
        field: "remark",
        len: remark.len(),
    })?;
    let ext_len_field = i32::try_from(ext_len).map_err(|_| FrameError::FieldTooLong {
        field: "extFields",
        len: ext_len,
    })?;
    let mut out = Vec::with_capacity(2 + 1 + 2 + 4 + 4 + 4 + remark.len() + 4 + ext_len);
    out.put_i16(code);
    out.put_u8(language_code(&cmd.language));
    out.put_i16(version);
    out.put_i32(cmd.opaque);
    out.put_i32(cmd.flag);
    out.put_i32(remark_len);
    out.put_slice(remark);
    out.put_i32(ext_len_field);
    for (key, value) in cmd.ext_fields.iter_bytes() {
        // Both lengths were checked above.
        out.put_i16(key.len() as i16);
        out.put_slice(key);
        out.put_i32(value.len() as i32);
        out.put_slice(value);
    }
    Ok(out)
}

/// Reads the binary header; every length is checked against the remaining bytes first.
struct BinaryReader<'a> {
    rest: &'a [u8],
}

impl<'a> BinaryReader<'a> {
    fn take(&mut self, field: &'static str, needed: usize) -> Result<&'a [u8], FrameError> {
        if needed > self.rest.len() {
            return Err(FrameError::BinaryHeaderTruncated {
                field,
                needed,
                available: self.rest.len(),
            });
        }
        let (head, tail) = self.rest.split_at(needed);
        self.rest = tail;
        Ok(head)
    }

    fn i16(&mut self, field: &'static str) -> Result<i16, FrameError> {
        let bytes = self.take(field, 2)?;
        Ok(i16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn i32(&mut self, field: &'static str) -> Result<i32, FrameError> {
        let bytes = self.take(field, 4)?;
        Ok(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u8(&mut self, field: &'static str) -> Result<u8, FrameError> {
        Ok(self.take(field, 1)?[0])
    }

    fn length(&mut self, field: &'static str, value: i64) -> Result<usize, FrameError> {
        usize::try_from(value).map_err(|_| FrameError::NegativeLength { field, value })
    }

    fn str(&mut self, field: &'static str, len: usize) -> Result<&'a str, FrameError> {
        let bytes = self.take(field, len)?;
        std::str::from_utf8(bytes).map_err(|source| FrameError::InvalidUtf8 { field, source })
    }

    fn string(&mut self, field: &'static str, len: usize) -> Result<String, FrameError> {
        self.str(field, len).map(str::to_owned)
    }
}

fn decode_binary_header(header: &[u8]) -> Result<RemotingCommand, FrameError> {
    let mut reader = BinaryReader { rest: header };
    let code = reader.i16("code")?;
    let language = reader.u8("language")?;
    let version = reader.i16("version")?;
    let opaque = reader.i32("opaque")?;
    let flag = reader.i32("flag")?;
    let remark_len = reader.i32("remark length")?;
    let remark_len = reader.length("remark length", i64::from(remark_len))?;
    let remark = match remark_len {
        0 => None,
        len => Some(reader.string("remark", len)?),
    };
    let ext_len = reader.i32("extFields length")?;
    let ext_len = reader.length("extFields length", i64::from(ext_len))?;
    let mut ext_reader = BinaryReader {
        rest: reader.take("extFields", ext_len)?,
    };
    // Each field costs 6 bytes of lengths: the text is at most what is left.
    let mut ext_fields = ExtFields::sized(ext_len / 8 + 1, ext_len);
    while !ext_reader.rest.is_empty() {
        let key_len = ext_reader.i16("extFields key length")?;
        let key_len = ext_reader.length("extFields key length", i64::from(key_len))?;
        let key = ext_reader.str("extFields key", key_len)?;
        let value_len = ext_reader.i32("extFields value length")?;
        let value_len = ext_reader.length("extFields value length", i64::from(value_len))?;
        let value = ext_reader.str("extFields value", value_len)?;
        ext_fields.push_decoded(key, value);
    }
    Ok(RemotingCommand {
        code: i32::from(code),
        language: language_name(language).to_owned(),
        version: i32::from(version),
        opaque,
        flag,
        remark,
        ext_fields,
        body: Bytes::new(),
        body_chain: Vec::new(),
        serialize_type: SerializeType::RocketMq,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The JSON header's keys are Apache's `RemotingCommand` fields, spelled as Java writes
    /// them: a client that looks one up by name must find it.
    #[test]
    fn json_headers_carry_apaches_keys() {
        let request = RemotingCommand::request(10, ExtFields::default()).with_opaque(3);
        let mut reply = request.response_to(14, Some("why".into()));
        reply.language = crate::LANGUAGE_JAVA.into();
        reply.ext_fields.insert("k", "v");
        let header: serde_json::Value =
            serde_json::from_slice(&encode_json_header(&reply).unwrap()).unwrap();
        let keys: Vec<&str> = header
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected = [
            "code",
            "extFields",
            "flag",
            "language",
            "opaque",
            "remark",
            "serializeTypeCurrentRPC",
            "version",
        ];
        expected.sort_unstable();
        let mut keys = keys;
        keys.sort_unstable();
        assert_eq!(keys, expected);
        assert_eq!(header["language"], "JAVA");
        assert_eq!(header["serializeTypeCurrentRPC"], "JSON");
        assert_eq!(header["flag"], 1);
    }

    #[test]
    fn binary_ext_fields_are_read_whole_and_a_malformed_tail_refused() {
        let command = RemotingCommand::request(
            10,
            ExtFields::from_iter([
                ("a", "1".to_owned()),
                ("bb", String::new()),
                ("ccc", "x".repeat(300)),
            ]),
        )
        .with_serialize_type(SerializeType::RocketMq);
        let header = encode_binary_header(&command).unwrap();
        assert_eq!(
            decode_binary_header(&header).unwrap().ext_fields,
            command.ext_fields
        );
        // The extFields length still claims the last byte, which is gone.
        assert!(matches!(
            decode_binary_header(&header[..header.len() - 1]),
            Err(FrameError::BinaryHeaderTruncated { .. })
        ));
        // A negative key length is refused, not read as a huge one.
        let mut negative = header[..2 + 1 + 2 + 4 + 4 + 4].to_vec();
        negative.extend_from_slice(&6i32.to_be_bytes());
        negative.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
        assert!(matches!(
            decode_binary_header(&negative),
            Err(FrameError::NegativeLength { .. })
        ));
    }

    #[test]
    fn a_body_chain_goes_on_the_wire_as_one_joined_body() {
        for serialize_type in [SerializeType::Json, SerializeType::RocketMq] {
            let parts = [&b"first|"[..], b"", b"second|", b"third"];
            let mut chained = sample(serialize_type).with_body(Bytes::from_static(b"head|"));
            chained.body_chain = parts.iter().map(|p| Bytes::copy_from_slice(p)).collect();
            // A clone keeps the header fields' hash order, so the headers encode alike.
            let mut joined = chained.clone();
            joined.body = Bytes::from_static(b"head|first|second|third");
            joined.body_chain.clear();
            assert_eq!(chained.body_len(), joined.body.len());
            let expected = encode_to_bytes(&joined).unwrap();
            assert_eq!(encode_to_bytes(&chained).unwrap(), expected);
            // The head plus the parts sent one after another make the same frame.
            let mut head = BytesMut::new();
            encode_head(&chained, &mut head).unwrap();
            let mut sent = head.to_vec();
            sent.extend_from_slice(&chained.body);
            for part in &chained.body_chain {
                sent.extend_from_slice(part);
            }
            assert_eq!(sent, expected.to_vec());
            let decoded = decode(&mut BytesMut::from(&sent[..])).unwrap().unwrap();
            assert_eq!(decoded.body, joined.body);
            assert!(decoded.body_chain.is_empty());
        }
    }

    fn sample(serialize_type: SerializeType) -> RemotingCommand {
        let ext = ExtFields::from_iter([
            ("topic".to_owned(), "TopicTest".to_owned()),
            ("queueId".to_owned(), "3".to_owned()),
        ]);
        RemotingCommand::request(11, ext)
            .with_opaque(-5)
            .with_remark("hello")
            .with_body(Bytes::from_static(b"\x00\x01body"))
            .with_serialize_type(serialize_type)
    }

    #[test]
    fn json_and_binary_frames_round_trip() {
        for serialize_type in [SerializeType::Json, SerializeType::RocketMq] {
            let command = sample(serialize_type);
            let mut buf = BytesMut::new();
            encode(&command, &mut buf).unwrap();
            let decoded = decode(&mut buf).unwrap().unwrap();
            assert_eq!(decoded, command);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn partial_frame_needs_more_bytes_and_leaves_buffer() {
        let frame = encode_to_bytes(&sample(SerializeType::Json)).unwrap();
        for cut in 0..frame.len() {
            let mut buf = BytesMut::from(&frame[..cut]);
            assert!(decode(&mut buf).unwrap().is_none());
            assert_eq!(buf.len(), cut);
        }
    }

    #[test]
    fn decode_consumes_exactly_one_frame() {
        let mut buf = BytesMut::new();
        let first = sample(SerializeType::Json).with_opaque(1);
        let second = sample(SerializeType::RocketMq).with_opaque(2);
        encode(&first, &mut buf).unwrap();
        encode(&second, &mut buf).unwrap();
        assert_eq!(decode(&mut buf).unwrap().unwrap().opaque, 1);
        assert_eq!(decode(&mut buf).unwrap().unwrap().opaque, 2);
        assert!(decode(&mut buf).unwrap().is_none());
    }

    #[test]
    fn json_header_accepts_numbers_booleans_strings_and_extra_keys() {
        let header = br#"{"code":"34","language":1,"version":"79","opaque":9,"flag":2,
            "remark":null,"extFields":{"a":"x","b":12,"c":true,"d":null,"e":1.5},
            "serializeTypeCurrentRPC":"JSON","somethingNew":[1,2]}"#;
        let command = decode_json_header(header).unwrap();
        assert_eq!(command.code, 34);
        assert_eq!(command.language, "CPP");
        assert_eq!(command.version, 79);
        assert!(command.is_oneway());
        assert_eq!(command.remark, None);
        assert_eq!(command.ext("a"), Some("x"));
        assert_eq!(command.ext("b"), Some("12"));
        assert_eq!(command.ext("c"), Some("true"));
        assert_eq!(command.ext("d"), None);
        assert_eq!(command.ext("e"), Some("1.5"));
    }

    #[test]
    fn nested_ext_values_are_kept_as_json_text() {
        let header =
            br#"{"code":1,"extFields":{"n":{"a":1},"l":[1,"x"],"big":18446744073709551615}}"#;
        let command = decode_json_header(header).unwrap();
        assert_eq!(command.ext("n"), Some(r#"{"a":1}"#));
        assert_eq!(command.ext("l"), Some(r#"[1,"x"]"#));
        assert_eq!(command.ext("big"), Some("18446744073709551615"));
        for not_an_object in [
            &br#"{"code":1,"extFields":"x"}"#[..],
            br#"{"code":1,"extFields":7}"#,
        ] {
            assert!(matches!(
                decode_json_header(not_an_object),
                Err(FrameError::InvalidHeaderField {
                    field: "extFields",
                    ..
                })
            ));
        }
        assert!(matches!(
            decode_json_header(b" 5"),
            Err(FrameError::HeaderNotObject)
        ));
        assert!(matches!(
            decode_json_header(b"nope"),
            Err(FrameError::HeaderJson { .. })
        ));
    }

    #[test]
    fn json_header_without_code_is_rejected() {
        let error = decode_json_header(br#"{"opaque":1}"#).unwrap_err();
        assert!(matches!(
            error,
            FrameError::MissingHeaderField { field: "code" }
        ));
    }

    #[test]
    fn binary_header_layout_matches_rocketmq_serializable() {
        let command = RemotingCommand::request(105, ExtFields::from_iter([("k", "vv")]))
            .with_opaque(7)
            .with_serialize_type(SerializeType::RocketMq);
        let header = encode_binary_header(&command).unwrap();
        let expected: Vec<u8> = [
            &[0, 105][..], // code
            &[12],         // language RUST
            &(crate::PROTOCOL_VERSION as i16).to_be_bytes(),
            &[0, 0, 0, 7], // opaque
            &[0, 0, 0, 0], // flag
            &[0, 0, 0, 0], // remark length
            &[0, 0, 0, 9], // extFields length
            &[0, 1, b'k'],
            &[0, 0, 0, 2, b'v', b'v'],
        ]
        .concat();
        assert_eq!(header, expected);
    }
}
