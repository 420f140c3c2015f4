//! The record codec: RocketMQ 4.x's CommitLog record layout (below). Pure, no I/O.
//!
//! ```text
//! big-endian                          offset
//! TOTALSIZE i32                       0
//! MAGIC u32 = 0xDAA320A7              4
//! BODYCRC i32 = crc32(body)&0x7FFFFFFF 8
//! QUEUEID i32                         12
//! FLAG i32                            16
//! QUEUEOFFSET i64                     20
//! PHYSICALOFFSET i64                  28
//! SYSFLAG i32                         36
//! BORNTIMESTAMP i64                   40
//! BORNHOST 4+4 (16+4 if SYSFLAG&0x10) 48
//! STORETIMESTAMP i64
//! STOREHOST 4+4 (16+4 if SYSFLAG&0x20)
//! RECONSUMETIMES i32
//! PREPARED_TX_OFFSET i64
//! BODY i32 length + bytes
//! TOPIC i8 length + bytes
//! PROPERTIES i16 length + bytes ("k\x01v\x02" pairs)
//! ```
//! A segment's unused tail is one blank filler `[remaining i32][BLANK_MAGIC]`.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use bytes::Bytes;

use crate::offset::{CommitLogOffset, QueueOffset};

pub const MESSAGE_MAGIC: u32 = 0xDAA3_20A7;
pub const BLANK_MAGIC: u32 = 0xCBD4_3194;
/// SYSFLAG bit: BORNHOST is IPv6 (16 + 4 bytes).
pub const BORN_HOST_V6_FLAG: i32 = 0x10;
/// SYSFLAG bit: STOREHOST is IPv6 (16 + 4 bytes).
pub const STORE_HOST_V6_FLAG: i32 = 0x20;
pub use crate::message::{NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR};
/// The property whose Java hash code becomes the ConsumeQueue tags code.
pub const TAGS_PROPERTY: &str = crate::message::PROPERTY_TAGS;
/// Bytes of a record with IPv4 hosts, an empty body, topic and properties.
pub const FIXED_OVERHEAD_BYTES: usize = 91;
/// Bytes of the blank filler that ends a segment.
pub const BLANK_FILLER_BYTES: usize = 8;

/// TOTALSIZE and MAGIC, the 8 bytes every record and the blank filler start with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// TOTALSIZE as stored (a record's length, or the blank filler's: the rest of the
    /// segment). Not checked: callers judge it against what they hold.
    pub size: i32,
    pub magic: u32,
}

impl Head {
    /// Bytes of a head.
    pub const BYTES: usize = BLANK_FILLER_BYTES;

    /// The head of a message record.
    #[inline]
    pub fn is_message(&self) -> bool {
        self.magic == MESSAGE_MAGIC
    }

    /// The head of the blank filler that ends a segment.
    #[inline]
    pub fn is_blank(&self) -> bool {
        self.magic == BLANK_MAGIC
    }

    /// Zeroes: nothing was ever written here.
    #[inline]
    pub fn is_zero(&self) -> bool {
        self.size == 0 && self.magic == 0
    }
}

/// The head at the start of `buf`, `None` when `buf` is shorter than [`Head::BYTES`]. The one
/// place a record's size and magic are read.
#[inline]
pub fn head(buf: &[u8]) -> Option<Head> {
    let bytes: &[u8; Head::BYTES] = buf.get(..Head::BYTES)?.try_into().ok()?;
    let [s0, s1, s2, s3, m0, m1, m2, m3] = *bytes;
    Some(Head {
        size: i32::from_be_bytes([s0, s1, s2, s3]),
        magic: u32::from_be_bytes([m0, m1, m2, m3]),
    })
}

/// Byte offset of STORETIMESTAMP for an IPv4 born host; +12 when the born host is IPv6.
const STORE_TIMESTAMP_AT_V4: usize = 56;
const SYS_FLAG_AT: usize = 36;

/// Why bytes are not a valid record, or a message cannot be encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("need {needed} bytes, only {available} available")]
    Truncated { needed: usize, available: usize },
    #[error("bad magic {found:#010x}")]
    BadMagic { found: u32 },
    #[error("bad total size {size}")]
    BadSize { size: i64 },
    #[error("fields take {actual} bytes but the record declares {declared}")]
    InconsistentLength { declared: usize, actual: usize },
    #[error("body crc mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BodyCrcMismatch { stored: u32, computed: u32 },
    #[error("{field} is not valid UTF-8")]
    BadUtf8 { field: &'static str },
    #[error("topic of {len} bytes exceeds 127")]
    TopicTooLong { len: usize },
    #[error("properties of {len} bytes exceed 32767")]
    PropertiesTooLong { len: usize },
    #[error("{field} is empty or holds a NUL byte")]
    BadText { field: &'static str },
    #[error("record says it is at {stored} but lies at {actual}")]
    WrongPosition { stored: u64, actual: u64 },
    #[error("body of {len} bytes exceeds i32::MAX")]
    BodyTooLong { len: usize },
}

/// What a producer sends; the store fills in offsets and the store timestamp.
#[derive(Clone, Debug)]
pub struct NewMessage<'a> {
    pub topic: &'a str,
    pub queue_id: u32,
    pub flag: i32,
    pub body: &'a [u8],
    /// RocketMQ form `k\u{1}v\u{2}k\u{1}v\u{2}`; the TAGS key gives the tags code.
    pub properties: &'a str,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
}

/// The positions the store assigns to a record when appending it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    pub queue_offset: QueueOffset,
    pub physical_offset: CommitLogOffset,
    pub store_timestamp_ms: i64,
}

/// A decoded record, owning its fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub topic: String,
    pub queue_id: u32,
    pub flag: i32,
    pub queue_offset: QueueOffset,
    pub physical_offset: CommitLogOffset,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub store_timestamp_ms: i64,
    pub store_host: SocketAddr,
    pub reconsume_times: i32,
    pub prepared_transaction_offset: i64,
    pub body: Bytes,
    pub properties: String,
    pub body_crc: u32,
}

impl Record {
    /// The properties as a sorted map.
    pub fn properties_map(&self) -> BTreeMap<String, String> {
        parse_properties(&self.properties)
    }

    /// The TAGS property, if any.
    pub fn tags(&self) -> Option<&str> {
        property(&self.properties, TAGS_PROPERTY)
    }
}

/// The fields dispatch and recovery need, borrowed from a validated record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader<'a> {
    pub size: u32,
    pub queue_id: u32,
    pub queue_offset: QueueOffset,
    pub physical_offset: CommitLogOffset,
    pub store_timestamp_ms: i64,
    pub topic: &'a str,
    pub properties: &'a str,
}

impl RecordHeader<'_> {
    /// Java hash of the TAGS property, 0 without tags.
    pub fn tags_code(&self) -> i64 {
        property(self.properties, TAGS_PROPERTY).map_or(0, tags_code)
    }
}

/// What the bytes at a position in a segment hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scanned<'a> {
    /// A complete record whose CRC matches.
    Message(RecordHeader<'a>),
    /// The blank filler that ends a segment, `size` bytes long.
    Blank { size: u32 },
    /// Zeroes: nothing was ever written here.
    End,
    /// A record cut short, bad magic, bad size or CRC: the log ends before it.
    Damaged(RecordError),
}

fn host_len(addr: &SocketAddr) -> usize {
    match addr {
        SocketAddr::V4(_) => 8,
        SocketAddr::V6(_) => 20,
    }
}

/// Bytes the encoded record will take; errors when a field exceeds its length prefix.
pub fn encoded_len(msg: &NewMessage<'_>) -> Result<usize, RecordError> {
    check_text(msg.topic, msg.properties)?;
    if msg.topic.len() > i8::MAX as usize {
        return Err(RecordError::TopicTooLong {
            len: msg.topic.len(),
        });
    }
    if msg.properties.len() > i16::MAX as usize {
        return Err(RecordError::PropertiesTooLong {
            len: msg.properties.len(),
        });
    }
    let len = FIXED_OVERHEAD_BYTES - 16
        + host_len(&msg.born_host)
        + host_len(&msg.store_host)
        + msg.body.len()
        + msg.topic.len()
        + msg.properties.len();
    if len > i32::MAX as usize {
        return Err(RecordError::BodyTooLong {
            len: msg.body.len(),
        });
    }
    Ok(len)
}

/// Topic and properties never hold NUL (and the topic is never empty), so a record whose
/// tail was torn off (zeroes on disk) fails to parse: those fields are not checksummed.
fn check_text(topic: &str, properties: &str) -> Result<(), RecordError> {
    if topic.is_empty() || topic.as_bytes().contains(&0) {
        return Err(RecordError::BadText { field: "topic" });
    }
    if properties.as_bytes().contains(&0) {
        return Err(RecordError::BadText {
            field: "properties",
        });
    }
    Ok(())
}

/// SYSFLAG with the host bits set from the actual address families.
fn effective_sys_flag(msg: &NewMessage<'_>) -> i32 {
    let mut flag = msg.sys_flag & !(BORN_HOST_V6_FLAG | STORE_HOST_V6_FLAG);
    if msg.born_host.is_ipv6() {
        flag |= BORN_HOST_V6_FLAG;
    }
    if msg.store_host.is_ipv6() {
        flag |= STORE_HOST_V6_FLAG;
    }
    flag
}

/// crc32 of the body as RocketMQ stores it (sign bit cleared).
pub fn body_crc(body: &[u8]) -> u32 {
    crc32fast::hash(body) & 0x7FFF_FFFF
}

struct Writer<'b> {
    buf: &'b mut [u8],
    at: usize,
}

impl Writer<'_> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.buf[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    #[inline]
    fn host(&mut self, addr: &SocketAddr) {
        match addr.ip() {
            IpAddr::V4(ip) => self.put(&ip.octets()),
            IpAddr::V6(ip) => self.put(&ip.octets()),
        }
        self.put(&i32::from(addr.port()).to_be_bytes());
    }
}

/// Encodes `msg` at the start of `dst` (at least [`encoded_len`] bytes); returns the size.
pub fn encode_into(
    dst: &mut [u8],
    msg: &NewMessage<'_>,
    placement: Placement,
) -> Result<usize, RecordError> {
    let size = encoded_len(msg)?;
    if dst.len() < size {
        return Err(RecordError::Truncated {
            needed: size,
            available: dst.len(),
        });
    }
    let mut w = Writer {
        buf: &mut dst[..size],
        at: 0,
    };
    w.put(&(size as i32).to_be_bytes());
    w.put(&MESSAGE_MAGIC.to_be_bytes());
    w.put(&body_crc(msg.body).to_be_bytes());
    w.put(&(msg.queue_id as i32).to_be_bytes());
    w.put(&msg.flag.to_be_bytes());
    w.put(&(placement.queue_offset.0 as i64).to_be_bytes());
    w.put(&(placement.physical_offset.0 as i64).to_be_bytes());
    w.put(&effective_sys_flag(msg).to_be_bytes());
    w.put(&msg.born_timestamp_ms.to_be_bytes());
    w.host(&msg.born_host);
    w.put(&placement.store_timestamp_ms.to_be_bytes());
    w.host(&msg.store_host);
    w.put(&msg.reconsume_times.to_be_bytes());
    w.put(&msg.prepared_transaction_offset.to_be_bytes());
    w.put(&(msg.body.len() as i32).to_be_bytes());
    w.put(msg.body);
    w.put(&[msg.topic.len() as u8]);
    w.put(msg.topic.as_bytes());
    w.put(&(msg.properties.len() as i16).to_be_bytes());
    w.put(msg.properties.as_bytes());
    debug_assert_eq!(w.at, size);
    Ok(size)
}

/// Encodes `msg` into a new buffer.
pub fn encode(msg: &NewMessage<'_>, placement: Placement) -> Result<Vec<u8>, RecordError> {
    let mut buf = vec![0u8; encoded_len(msg)?];
    encode_into(&mut buf, msg, placement)?;
    Ok(buf)
}

/// Writes the blank filler over the first 8 bytes of `dst`, declaring `remaining` bytes.
pub fn encode_blank(dst: &mut [u8], remaining: u32) {
    dst[..4].copy_from_slice(&(remaining as i32).to_be_bytes());
    dst[4..8].copy_from_slice(&BLANK_MAGIC.to_be_bytes());
}

struct Reader<'b> {
    buf: &'b [u8],
    at: usize,
}

impl<'b> Reader<'b> {
    fn take(&mut self, n: usize) -> Result<&'b [u8], RecordError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|end| *end <= self.buf.len())
            .ok_or(RecordError::InconsistentLength {
                declared: self.buf.len(),
                actual: self.at + n,
            })?;
        let bytes = &self.buf[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], RecordError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn i8(&mut self) -> Result<i8, RecordError> {
        Ok(i8::from_be_bytes(self.array()?))
    }
    fn i16(&mut self) -> Result<i16, RecordError> {
        Ok(i16::from_be_bytes(self.array()?))
    }
    fn i32(&mut self) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.array()?))
    }
    fn i64(&mut self) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    fn host(&mut self, v6: bool) -> Result<SocketAddr, RecordError> {
        let ip = if v6 {
            IpAddr::V6(Ipv6Addr::from(self.array::<16>()?))
        } else {
            IpAddr::V4(Ipv4Addr::from(self.array::<4>()?))
        };
        let port = self.i32()?;
        Ok(SocketAddr::new(ip, port as u16))
    }

    fn str(&mut self, n: usize, field: &'static str) -> Result<&'b str, RecordError> {
        std::str::from_utf8(self.take(n)?).map_err(|_| RecordError::BadUtf8 { field })
    }
}

/// Checks TOTALSIZE and MAGIC; returns the declared size when the whole record is present.
fn frame(buf: &[u8]) -> Result<usize, RecordError> {
    let Head { size, magic } = head(buf).ok_or(RecordError::Truncated {
        needed: Head::BYTES,
        available: buf.len(),
    })?;
    if magic != MESSAGE_MAGIC {
        return Err(RecordError::BadMagic { found: magic });
    }
    if (size as i64) < FIXED_OVERHEAD_BYTES as i64 {
        return Err(RecordError::BadSize { size: size as i64 });
    }
    let size = size as usize;
    if size > buf.len() {
        return Err(RecordError::Truncated {
            needed: size,
            available: buf.len(),
        });
    }
    Ok(size)
}

/// A length field's value as a length; a negative one is a bad size.
#[inline]
fn length(field: impl Into<i64>) -> Result<usize, RecordError> {
    let field: i64 = field.into();
    usize::try_from(field).map_err(|_| RecordError::BadSize { size: field })
}

struct Parsed<'b> {
    header: RecordHeader<'b>,
    flag: i32,
    sys_flag: i32,
    born_timestamp_ms: i64,
    born_host: SocketAddr,
    store_host: SocketAddr,
    reconsume_times: i32,
    prepared_transaction_offset: i64,
    body: &'b [u8],
    body_crc: u32,
}

/// Parses and validates (including the body CRC) one record at the start of `buf`.
fn parse(buf: &[u8], crc: BodyCrc) -> Result<Parsed<'_>, RecordError> {
    let size = frame(buf)?;
    let mut r = Reader {
        buf: &buf[..size],
        at: 8,
    };
    let stored_crc = r.i32()? as u32;
    let queue_id = r.i32()? as u32;
    let flag = r.i32()?;
    let queue_offset = QueueOffset(r.i64()? as u64);
    let physical_offset = CommitLogOffset(r.i64()? as u64);
    let sys_flag = r.i32()?;
    let born_timestamp_ms = r.i64()?;
    let born_host = r.host(sys_flag & BORN_HOST_V6_FLAG != 0)?;
    let store_timestamp_ms = r.i64()?;
    let store_host = r.host(sys_flag & STORE_HOST_V6_FLAG != 0)?;
    let reconsume_times = r.i32()?;
    let prepared_transaction_offset = r.i64()?;
    let body_len = length(r.i32()?)?;
    let body = r.take(body_len)?;
    let topic_len = length(r.i8()?)?;
    let topic = r.str(topic_len, "topic")?;
    let properties_len = length(r.i16()?)?;
    let properties = r.str(properties_len, "properties")?;
    if r.at != size {
        return Err(RecordError::InconsistentLength {
            declared: size,
            actual: r.at,
        });
    }
    check_text(topic, properties)?;
    let computed = match crc {
        BodyCrc::Verify => body_crc(body),
        BodyCrc::Skip => stored_crc,
    };
    if computed != stored_crc {
        return Err(RecordError::BodyCrcMismatch {
            stored: stored_crc,
            computed,
        });
    }
    Ok(Parsed {
        header: RecordHeader {
            size: size as u32,
            queue_id,
            queue_offset,
            physical_offset,
            store_timestamp_ms,
            topic,
            properties,
        },
        flag,
        sys_flag,
        born_timestamp_ms,
        born_host,
        store_host,
        reconsume_times,
        prepared_transaction_offset,
        body,
        body_crc: stored_crc,
    })
}

/// Decodes one record at the start of `buf`; returns it and the bytes it used.
pub fn decode(buf: &[u8]) -> Result<(Record, usize), RecordError> {
    let p = parse(buf, BodyCrc::Verify)?;
    let record = Record {
        topic: p.header.topic.to_owned(),
        queue_id: p.header.queue_id,
        flag: p.flag,
        queue_offset: p.header.queue_offset,
        physical_offset: p.header.physical_offset,
        sys_flag: p.sys_flag,
        born_timestamp_ms: p.born_timestamp_ms,
        born_host: p.born_host,
        store_timestamp_ms: p.header.store_timestamp_ms,
        store_host: p.store_host,
        reconsume_times: p.reconsume_times,
        prepared_transaction_offset: p.prepared_transaction_offset,
        body: Bytes::copy_from_slice(p.body),
        properties: p.header.properties.to_owned(),
        body_crc: p.body_crc,
    };
    Ok((record, p.header.size as usize))
}

/// Decodes a pull body: records concatenated byte for byte.
pub fn decode_all(mut buf: &[u8]) -> Result<Vec<Record>, RecordError> {
    let mut records = Vec::new();
    while !buf.is_empty() {
        let (record, used) = decode(buf)?;
        records.push(record);
        buf = &buf[used..];
    }
    Ok(records)
}

/// Whether a scan recomputes the body CRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BodyCrc {
    Verify,
    /// The bytes were verified already (recovery's second pass).
    Skip,
}

/// Classifies the bytes at the start of `buf` (the rest of a segment), checking the CRC.
pub fn scan(buf: &[u8]) -> Scanned<'_> {
    scan_with(buf, BodyCrc::Verify)
}

/// Classifies the bytes at the start of `buf` (the rest of a segment).
pub fn scan_with(buf: &[u8], crc: BodyCrc) -> Scanned<'_> {
    if let Some(head) = head(buf) {
        if head.is_zero() {
            return Scanned::End;
        }
        if head.is_blank() {
            return match u32::try_from(head.size) {
                Ok(size) if size as usize == buf.len() => Scanned::Blank { size },
                _ => Scanned::Damaged(RecordError::BadSize {
                    size: i64::from(head.size),
                }),
            };
        }
    } else if buf.iter().all(|b| *b == 0) {
        return Scanned::End;
    }
    match parse(buf, crc) {
        Ok(p) => Scanned::Message(p.header),
        Err(e) => Scanned::Damaged(e),
    }
}

/// STORETIMESTAMP of a record known to be valid (for timestamp search and time lag).
pub fn store_timestamp_of(record: &[u8]) -> Option<i64> {
    let sys_flag = i32::from_be_bytes(record.get(SYS_FLAG_AT..SYS_FLAG_AT + 4)?.try_into().ok()?);
    let at = STORE_TIMESTAMP_AT_V4
        + if sys_flag & BORN_HOST_V6_FLAG != 0 {
            12
        } else {
            0
        };
    Some(i64::from_be_bytes(record.get(at..at + 8)?.try_into().ok()?))
}

/// Byte offset of BODY's length for IPv4 hosts; +12 for each IPv6 host.
const BODY_LEN_AT_V4: usize = 84;
const QUEUE_OFFSET_AT: usize = 20;
/// Byte offset of RECONSUMETIMES for IPv4 hosts; +12 for each IPv6 host.
const RECONSUME_TIMES_AT_V4: usize = 72;

/// QUEUEOFFSET and RECONSUMETIMES of a record known to be valid, without decoding it (a POP
/// receive needs both for every message it hands out).
pub fn queue_offset_and_reconsume_times_of(record: &[u8]) -> Option<(QueueOffset, i32)> {
    let read = |at: usize, n: usize| record.get(at..at.checked_add(n)?);
    let queue_offset = i64::from_be_bytes(read(QUEUE_OFFSET_AT, 8)?.try_into().ok()?);
    let sys_flag = i32::from_be_bytes(read(SYS_FLAG_AT, 4)?.try_into().ok()?);
    let v6 = |flag: i32| if sys_flag & flag != 0 { 12 } else { 0 };
    let at = RECONSUME_TIMES_AT_V4 + v6(BORN_HOST_V6_FLAG) + v6(STORE_HOST_V6_FLAG);
    let reconsume_times = i32::from_be_bytes(read(at, 4)?.try_into().ok()?);
    Some((
        QueueOffset(u64::try_from(queue_offset).ok()?),
        reconsume_times,
    ))
}

/// The PROPERTIES of a stored record, read through its length fields without decoding or
/// checking the rest (a pull's property filter runs it on every record it scans).
pub fn properties_of(record: &[u8]) -> Option<&str> {
    let read = |at: usize, n: usize| record.get(at..at.checked_add(n)?);
    let sys_flag = i32::from_be_bytes(read(SYS_FLAG_AT, 4)?.try_into().ok()?);
    let v6 = |flag: i32| if sys_flag & flag != 0 { 12 } else { 0 };
    let body_len_at = BODY_LEN_AT_V4 + v6(BORN_HOST_V6_FLAG) + v6(STORE_HOST_V6_FLAG);
    let body_len = i32::from_be_bytes(read(body_len_at, 4)?.try_into().ok()?);
    let topic_len_at = body_len_at.checked_add(4 + usize::try_from(body_len).ok()?)?;
    let topic_len =
        usize::try_from(i8::from_be_bytes(read(topic_len_at, 1)?.try_into().ok()?)).ok()?;
    let properties_len_at = topic_len_at.checked_add(1 + topic_len)?;
    let properties_len = i16::from_be_bytes(read(properties_len_at, 2)?.try_into().ok()?);
    let properties = read(properties_len_at + 2, usize::try_from(properties_len).ok()?)?;
    std::str::from_utf8(properties).ok()
}

/// Finds one property's value without allocating.
pub fn property<'p>(properties: &'p str, key: &str) -> Option<&'p str> {
    // Byte scan: both separators are ASCII, and a send looks up eight keys (TAGS, DELAY, the
    // timers, KEYS...), most of them absent: memchr finds each pair's end a word at a time.
    let (pairs, key) = (properties.as_bytes(), key.as_bytes());
    let mut start = 0;
    while start < pairs.len() {
        let end = memchr::memchr(PROPERTY_SEPARATOR as u8, &pairs[start..])
            .map_or(pairs.len(), |at| start + at);
        let pair = &pairs[start..end];
        if pair.starts_with(key) && pair.get(key.len()) == Some(&(NAME_VALUE_SEPARATOR as u8)) {
            return Some(&properties[start + key.len() + 1..end]);
        }
        start = end + 1;
    }
    None
}

/// Parses `k\u{1}v\u{2}...`; a pair without a separator is ignored, as RocketMQ does.
pub fn parse_properties(properties: &str) -> BTreeMap<String, String> {
    properties
        .split(PROPERTY_SEPARATOR)
        .filter_map(|pair| pair.split_once(NAME_VALUE_SEPARATOR))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// Encodes pairs as `k\u{1}v\u{2}` for each, the form RocketMQ clients send.
pub fn encode_properties<'p>(pairs: impl IntoIterator<Item = (&'p str, &'p str)>) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        out.push_str(k);
        out.push(NAME_VALUE_SEPARATOR);
        out.push_str(v);
        out.push(PROPERTY_SEPARATOR);
    }
    out
}

/// Java's `String.hashCode()` of the tags (over UTF-16 units), widened to i64.
pub fn tags_code(tags: &str) -> i64 {
    let hash = tags.encode_utf16().fold(0i32, |h, unit| {
        h.wrapping_mul(31).wrapping_add(i32::from(unit))
    });
    i64::from(hash)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message<'a>(body: &'a [u8], properties: &'a str) -> NewMessage<'a> {
        NewMessage {
            topic: "TopicTest",
            queue_id: 3,
            flag: 7,
            body,
            properties,
            sys_flag: 0,
            born_timestamp_ms: 1_700_000_000_000,
            born_host: "10.1.2.3:50000".parse().unwrap(),
            store_host: "10.9.8.7:10911".parse().unwrap(),
            reconsume_times: 2,
            prepared_transaction_offset: 0,
        }
    }

    const PLACEMENT: Placement = Placement {
        queue_offset: QueueOffset(42),
        physical_offset: CommitLogOffset(4096),
        store_timestamp_ms: 1_700_000_000_123,
    };

    #[test]
    fn java_hash_codes() {
        assert_eq!(tags_code(""), 0);
        assert_eq!(tags_code("TagA"), 2_598_919);
        // "polygenelubricants".hashCode() == Integer.MIN_VALUE in Java.
        assert_eq!(tags_code("polygenelubricants"), i64::from(i32::MIN));
        assert_eq!(tags_code("é"), 233);
    }

    #[test]
    fn layout_offsets_match_the_design_table() {
        let msg = message(b"hello", "TAGS\u{1}TagA\u{2}");
        let bytes = encode(&msg, PLACEMENT).unwrap();
        assert_eq!(bytes.len(), FIXED_OVERHEAD_BYTES + 5 + 9 + 10);
        assert_eq!(&bytes[0..4], &(bytes.len() as i32).to_be_bytes());
        assert_eq!(&bytes[4..8], &[0xDA, 0xA3, 0x20, 0xA7]);
        assert_eq!(&bytes[8..12], &body_crc(b"hello").to_be_bytes());
        assert_eq!(&bytes[12..16], &3i32.to_be_bytes());
        assert_eq!(&bytes[16..20], &7i32.to_be_bytes());
        assert_eq!(&bytes[20..28], &42i64.to_be_bytes());
        assert_eq!(&bytes[28..36], &4096i64.to_be_bytes());
        assert_eq!(&bytes[36..40], &0i32.to_be_bytes());
        assert_eq!(&bytes[48..52], &[10, 1, 2, 3]);
        assert_eq!(&bytes[52..56], &50000i32.to_be_bytes());
        assert_eq!(&bytes[56..64], &PLACEMENT.store_timestamp_ms.to_be_bytes());
        assert_eq!(&bytes[64..68], &[10, 9, 8, 7]);
        assert_eq!(&bytes[72..76], &2i32.to_be_bytes());
        assert_eq!(&bytes[84..88], &5i32.to_be_bytes());
        assert_eq!(&bytes[88..93], b"hello");
        assert_eq!(bytes[93], 9);
        assert_eq!(&bytes[94..103], b"TopicTest");
        assert_eq!(&bytes[103..105], &10i16.to_be_bytes());
        assert_eq!(
            store_timestamp_of(&bytes),
            Some(PLACEMENT.store_timestamp_ms)
        );
    }

    #[test]
    fn ipv6_hosts_set_sys_flag_bits_and_round_trip() {
        let mut msg = message(b"", "");
        msg.born_host = "[2001:db8::1]:4000".parse().unwrap();
        msg.store_host = "[::1]:10911".parse().unwrap();
        let bytes = encode(&msg, PLACEMENT).unwrap();
        assert_eq!(bytes.len(), FIXED_OVERHEAD_BYTES + 24 + 9);
        let (record, used) = decode(&bytes).unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(record.sys_flag, BORN_HOST_V6_FLAG | STORE_HOST_V6_FLAG);
        assert_eq!(record.born_host, msg.born_host);
        assert_eq!(record.store_host, msg.store_host);
        assert!(record.body.is_empty());
        assert_eq!(
            store_timestamp_of(&bytes),
            Some(PLACEMENT.store_timestamp_ms)
        );
    }

    #[test]
    fn scan_classifies_blank_end_and_damage() {
        let mut segment = vec![0u8; 64];
        assert_eq!(scan(&segment), Scanned::End);
        encode_blank(&mut segment, 64);
        assert_eq!(scan(&segment), Scanned::Blank { size: 64 });
        let bytes = encode(&message(b"body", ""), PLACEMENT).unwrap();
        assert!(matches!(scan(&bytes), Scanned::Message(h) if h.size as usize == bytes.len()));
        assert!(matches!(
            scan(&bytes[..bytes.len() - 1]),
            Scanned::Damaged(RecordError::Truncated { .. })
        ));
        let mut flipped = bytes.clone();
        flipped[90] ^= 0x40;
        assert!(matches!(
            scan(&flipped),
            Scanned::Damaged(RecordError::BodyCrcMismatch { .. })
        ));
    }

    #[test]
    fn head_reads_size_and_magic_of_records_fillers_and_zeroes() {
        let bytes = encode(&message(b"body", ""), PLACEMENT).unwrap();
        let message_head = head(&bytes).unwrap();
        assert_eq!(message_head.size as usize, bytes.len());
        assert!(message_head.is_message() && !message_head.is_blank());
        let mut filler = [0u8; 8];
        assert!(head(&filler).unwrap().is_zero());
        encode_blank(&mut filler, 4096);
        let blank = head(&filler).unwrap();
        assert_eq!(
            blank,
            Head {
                size: 4096,
                magic: BLANK_MAGIC
            }
        );
        assert!(blank.is_blank() && !blank.is_message() && !blank.is_zero());
        assert_eq!(head(&filler[..7]), None);
        filler[..4].copy_from_slice(&(-1i32).to_be_bytes());
        assert_eq!(head(&filler).unwrap().size, -1);
    }

    #[test]
    fn properties_round_trip() {
        let encoded = encode_properties([("TAGS", "A"), ("KEYS", "k1 k2")]);
        assert_eq!(encoded, "TAGS\u{1}A\u{2}KEYS\u{1}k1 k2\u{2}");
        let map = parse_properties(&encoded);
        assert_eq!(map["KEYS"], "k1 k2");
        assert_eq!(property(&encoded, "TAGS"), Some("A"));
        assert_eq!(property(&encoded, "NONE"), None);
    }

    #[test]
    fn property_lookup_matches_whole_names_only() {
        let text = "TAGSX\u{1}no\u{2}TAG\u{1}no\u{2}TAGS\u{1}a\u{1}b\u{2}EMPTY\u{1}\u{2}BARE\u{2}LAST\u{1}end";
        assert_eq!(property(text, "TAGS"), Some("a\u{1}b"));
        assert_eq!(property(text, "EMPTY"), Some(""));
        assert_eq!(property(text, "LAST"), Some("end"));
        assert_eq!(property(text, "BARE"), None);
        assert_eq!(property(text, "TA"), None);
        assert_eq!(property("", "TAGS"), None);
        assert_eq!(property("\u{2}\u{2}", "TAGS"), None);
        // The same answers as the map every pair parses into.
        let map = parse_properties(text);
        for key in ["TAGSX", "TAG", "TAGS", "EMPTY", "LAST", "BARE"] {
            assert_eq!(
                property(text, key),
                map.get(key).map(String::as_str),
                "{key}"
            );
        }
    }

    #[test]
    fn properties_of_reads_the_stored_properties() {
        for v6 in [false, true] {
            let mut msg = message(b"some body", "TAGS\u{1}TagA\u{2}a\u{1}7\u{2}");
            if v6 {
                msg.born_host = "[2001:db8::1]:4000".parse().unwrap();
                msg.store_host = "[::1]:10911".parse().unwrap();
            }
            let bytes = encode(&msg, PLACEMENT).unwrap();
            assert_eq!(properties_of(&bytes), Some(msg.properties));
            assert_eq!(properties_of(&bytes[..bytes.len() - 1]), None);
        }
        assert_eq!(properties_of(&[]), None);
    }

    #[test]
    fn queue_offset_and_reconsume_times_are_read_in_place() {
        for (born, store) in [
            ("10.0.0.1:1", "10.0.0.2:2"),
            ("[2001:db8::1]:4000", "[::1]:10911"),
        ] {
            let mut msg = message(b"body", "");
            msg.born_host = born.parse().unwrap();
            msg.store_host = store.parse().unwrap();
            msg.reconsume_times = 7;
            let bytes = encode(&msg, PLACEMENT).unwrap();
            let decoded = decode(&bytes).unwrap().0;
            assert_eq!(
                queue_offset_and_reconsume_times_of(&bytes),
                Some((decoded.queue_offset, 7))
            );
        }
        assert_eq!(queue_offset_and_reconsume_times_of(&[0; 40]), None);
    }

    #[test]
    fn oversized_fields_are_rejected() {
        let topic = "t".repeat(128);
        let mut msg = message(b"", "");
        msg.topic = &topic;
        assert_eq!(
            encode(&msg, PLACEMENT),
            Err(RecordError::TopicTooLong { len: 128 })
        );
    }
}
