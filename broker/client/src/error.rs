//! The client's one error enum: every variant names the broker or topic involved.

use quiver_protocol::{BodyError, FrameError, HeaderError};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: is a quiver broker listening there?")]
    Connect {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("connection to {addr} closed")]
    ConnectionClosed { addr: String },
    #[error("TLS with {addr} failed: {reason}")]
    Tls { addr: String, reason: String },
    #[error("I/O error on the connection to {addr}")]
    Io {
        addr: String,
        #[source]
        source: std::io::Error,
    },
    #[error("could not encode request code {code} for {addr}")]
    Encode {
        addr: String,
        code: i32,
        #[source]
        source: FrameError,
    },
    #[error("request code {code} to {addr} got no response within {timeout_ms} ms")]
    Timeout {
        addr: String,
        code: i32,
        timeout_ms: u64,
    },
    #[error("topic {topic} does not exist: create it with `quiver topics create {topic}`")]
    TopicNotFound { topic: String },
    #[error("message of {size_bytes} bytes exceeds the {max_bytes}-byte limit")]
    MessageTooLarge { size_bytes: usize, max_bytes: usize },
    #[error("broker {addr} is busy: {remark}")]
    BrokerBusy { addr: String, remark: String },
    #[error("broker {addr} answered request code {request_code} with code {code}: {remark}")]
    Broker {
        addr: String,
        request_code: i32,
        code: i32,
        remark: String,
    },
    #[error("invalid response header from {addr} for request code {request_code}")]
    Header {
        addr: String,
        request_code: i32,
        #[source]
        source: HeaderError,
    },
    #[error("invalid response body from {addr} for request code {request_code}")]
    Body {
        addr: String,
        request_code: i32,
        #[source]
        source: BodyError,
    },
    #[error("pull body from {addr} for {topic}:{queue_id} is malformed")]
    Records {
        addr: String,
        topic: String,
        queue_id: u32,
        #[source]
        source: quiver_protocol::record::RecordError,
    },
    #[error("records from {addr} for request code {request_code} are malformed")]
    QueryBody {
        addr: String,
        request_code: i32,
        #[source]
        source: quiver_protocol::record::RecordError,
    },
    #[error("no {what} found")]
    MessageNotFound { what: String },
    #[error("batch for topic {topic} cannot be encoded")]
    BatchEncode {
        topic: String,
        #[source]
        source: quiver_protocol::MessageError,
    },
    #[error("no broker serves topic {topic} for {purpose}")]
    NoRoute {
        topic: String,
        purpose: &'static str,
    },
    #[error("broker {broker_name} has no master address in the route")]
    NoBrokerAddress { broker_name: String },
    #[error("invalid argument {what}: {reason}")]
    InvalidArgument { what: &'static str, reason: String },
    #[error("the client is shut down")]
    Shutdown,
}

impl ClientError {
    /// The broker does not know the request (an older broker or another implementation).
    pub fn is_unsupported(&self) -> bool {
        matches!(self, ClientError::Broker { code, .. }
            if *code == quiver_protocol::code::response::REQUEST_CODE_NOT_SUPPORTED)
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;
