//! quiver-protocol: a pure codec for the Apache RocketMQ 4.x remoting protocol.
//!
//! No I/O and no async: bytes in, typed commands out, and back. The server and the client
//! own the sockets; [`frame`] documents the frame, [`code`] the request and response codes.
//!
//! - [`acl`]: RocketMQ ACL signatures (HMAC-SHA1 over the extFields values and the body).
//! - [`frame`]: length-prefixed frames with a JSON or binary (ROCKETMQ) header.
//! - [`code`]: request and response codes.
//! - [`header`]: typed extFields per request code (`from_ext` / `to_ext`).
//! - [`body`]: JSON bodies as Java (fastjson) and C++ (jsoncpp) peers write and read them.
//! - [`message`]: batch bodies, offset message ids, property names.
//! - [`record`]: the message record, byte for byte as the CommitLog stores it and a pull body
//!   carries it.
//! - [`offset`]: typed CommitLog and ConsumeQueue positions.
//! - [`sql92`]: RocketMQ's SQL92 message selector (subscriptions of expression type SQL92).
//!
//! ```
//! use bytes::BytesMut;
//! use quiver_protocol::code::{request, response};
//! use quiver_protocol::header::{GetMaxOffsetRequestHeader, GetMaxOffsetResponseHeader};
//! use quiver_protocol::{frame, RemotingCommand};
//!
//! let header = GetMaxOffsetRequestHeader { topic: "TopicTest".into(), queue_id: 1 };
//! let request = RemotingCommand::request(request::GET_MAX_OFFSET, header.to_ext()).with_opaque(7);
//! let mut wire = BytesMut::new();
//! frame::encode(&request, &mut wire).unwrap();
//!
//! let received = frame::decode(&mut wire).unwrap().expect("one whole frame");
//! let asked = GetMaxOffsetRequestHeader::from_command(&received).unwrap();
//! assert_eq!(asked, header);
//!
//! let reply = received
//!     .response_to(response::SUCCESS, None)
//!     .with_ext_fields(GetMaxOffsetResponseHeader { offset: 42 }.to_ext());
//! assert!(reply.is_response());
//! assert_eq!(reply.opaque, 7);
//! ```

#![forbid(unsafe_code)]

pub mod acl;
pub mod body;
pub mod code;
mod command;
mod error;
mod ext_fields;
pub mod frame;
pub mod header;
pub mod message;
pub mod offset;
pub mod record;
pub mod sql92;

pub use command::{
    language_code, language_name, ExtFields, RemotingCommand, SerializeType, FLAG_ONEWAY,
    FLAG_RESPONSE, LANGUAGE_JAVA, LANGUAGE_RUST, PROTOCOL_VERSION,
};
pub use error::{BodyError, FrameError, HeaderError, MessageError};
pub use offset::{CommitLogOffset, QueueOffset};

/// Largest frame accepted or produced: the bytes after the length prefix.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
