//! quiver-protocol: a pure codec for the Apache RocketMQ 4.x remoting protocol.
//!
//! No I/O and no async: bytes in, typed commands out, and back. The server and the client
//! own the sockets; see DESIGN §3 for the frame and the request codes.

pub mod body;
pub mod code;
mod command;
mod error;
pub mod frame;
pub mod header;
pub mod message;

pub use command::{
    language_code, language_name, RemotingCommand, SerializeType, FLAG_ONEWAY, FLAG_RESPONSE,
    LANGUAGE_RUST, PROTOCOL_VERSION,
};
pub use error::{BodyError, FrameError, HeaderError, MessageError};

/// Largest frame accepted or produced: the bytes after the length prefix.
pub const MAX_FRAME_BYTES: usize = 16 * 1024 * 1024;
