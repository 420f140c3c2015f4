//! The gRPC port: `apache.rocketmq.v2.MessagingService`, the protocol RocketMQ 5.x clients
//! speak to a Proxy, served by the broker itself from the same store as the remoting port.
//!
//! `listener.rs` accepts (TLS as the remoting port); `messaging.rs` passes each call through
//! `call.rs` (authorised by ACL, then counted by result code) to the file of its family,
//! which decodes it, calls the broker's services and answers their errors as `status.rs`
//! maps them: `route.rs` (QueryRoute, QueryAssignment), `send.rs` (SendMessage, over the
//! produce service), `transaction.rs` (EndTransaction over the transaction service, and the
//! check-back's command), `telemetry.rs` (the settings handshake and the sessions the broker
//! pushes commands to), `consume.rs` (Receive, Ack, ChangeInvisibleDuration,
//! ForwardMessageToDeadLetterQueue over the POP service; `renew.rs` keeps `auto_renew`
//! receives invisible for their connected client); `convert.rs` maps messages to and from
//! stored records. What the broker keeps for the port (its sessions, renewals and counters)
//! is `crate::grpc_state`, which imports none of this.

mod auth;
mod call;
mod connection;
mod consume;
mod convert;
mod listener;
mod messaging;
mod renew;
mod route;
mod send;
mod status;
mod telemetry;
mod transaction;

pub use listener::serve;
pub use transaction::TransactionHandle;
