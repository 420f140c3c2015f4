//! One error enum per concern: framing, typed headers, bodies, message forms.

/// Why a frame could not be decoded or encoded. Framing errors mean the stream is out of sync:
/// the connection should be closed.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {declared_bytes} bytes exceeds the {max_bytes}-byte limit")]
    TooLarge {
        declared_bytes: u64,
        max_bytes: usize,
    },
    #[error(
        "header of {header_len} bytes exceeds the {max_bytes}-byte limit of its 24-bit length"
    )]
    HeaderTooLarge { header_len: usize, max_bytes: usize },
    #[error("negative length {value} in field {field}")]
    NegativeLength { field: &'static str, value: i64 },
    #[error("frame of {total_len} bytes is too short to hold the header-length word")]
    TooShort { total_len: usize },
    #[error("header length {header_len} runs past the frame ({available} bytes available)")]
    HeaderPastFrame { header_len: usize, available: usize },
    #[error("unknown serialize type {value}")]
    UnknownSerializeType { value: u8 },
    #[error("header is not valid JSON")]
    HeaderJson {
        #[source]
        source: serde_json::Error,
    },
    #[error("JSON header is not an object")]
    HeaderNotObject,
    #[error("header field {field} is missing")]
    MissingHeaderField { field: &'static str },
    #[error("header field {field} has invalid value {value}")]
    InvalidHeaderField { field: &'static str, value: String },
    #[error("binary header truncated reading {field}: needs {needed} bytes, {available} left")]
    BinaryHeaderTruncated {
        field: &'static str,
        needed: usize,
        available: usize,
    },
    #[error("binary header field {field} is not valid UTF-8")]
    InvalidUtf8 {
        field: &'static str,
        #[source]
        source: std::str::Utf8Error,
    },
    #[error("binary header field {field} of {len} bytes does not fit its length prefix")]
    FieldTooLong { field: &'static str, len: usize },
    #[error("could not serialize the JSON header")]
    EncodeJson {
        #[source]
        source: serde_json::Error,
    },
}

/// A typed header could not be built from a request's extFields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("required header field {field} is missing")]
    Missing { field: &'static str },
    #[error("header field {field} has invalid value {value:?}")]
    Invalid { field: &'static str, value: String },
}

/// A JSON body could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    #[error("body of {what} is not valid JSON")]
    Json {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("body of {what} is not valid UTF-8")]
    Utf8 {
        what: &'static str,
        #[source]
        source: std::str::Utf8Error,
    },
    #[error("body of {what}: {reason}")]
    Shape { what: &'static str, reason: String },
}

/// A message form carried in a request body (batch, message id) is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MessageError {
    #[error("batch message truncated at byte {offset}: needs {needed} bytes, {available} left")]
    Truncated {
        offset: usize,
        needed: usize,
        available: usize,
    },
    #[error("batch message at byte {offset} declares invalid length {value} for {field}")]
    InvalidLength {
        offset: usize,
        field: &'static str,
        value: i64,
    },
    #[error("batch message at byte {offset}: {field} is not valid UTF-8")]
    InvalidUtf8 { offset: usize, field: &'static str },
    #[error("batch message field {field} of {len} bytes is too long for its length prefix")]
    FieldTooLong { field: &'static str, len: usize },
    #[error("message id {id:?} is invalid: {reason}")]
    InvalidMessageId { id: String, reason: &'static str },
}
