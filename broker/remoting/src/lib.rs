//! One tokio [`Connection`] for RocketMQ RemotingCommand frames: framed reads and writes,
//! requests matched to responses by opaque, oneway sends, and the requests the other side
//! initiates, handed out by [`Incoming`].
//!
//! A crate of its own because `quiver-protocol` stays a pure codec (no I/O) and the broker
//! should not link the client library: both the broker and `quiver-client` use this one.
#![forbid(unsafe_code)]

pub mod arrival;
mod budget;
mod connection;
mod plain;
mod reader;
pub mod tls;
mod writer;

pub use arrival::{Arrivals, StampedRead};
pub use budget::{ByteBudget, HeldBytes, PerConnectionBudget};
pub use connection::{
    Connection, ConnectionError, Inbound, Incoming, OnWritten, Options, Outbound, OutboundSlot,
};

#[cfg(test)]
mod tests;
