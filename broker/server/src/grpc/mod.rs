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
//! stored records.

mod auth;
mod call;
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

use std::sync::OnceLock;

use quiver_grpc_proto::v2::Code;

pub use listener::serve;
pub use telemetry::Sessions;
pub use transaction::{check_back, TransactionHandle};

/// What the gRPC side shares with the rest of the broker.
#[derive(Default)]
pub struct GrpcState {
    /// host:port 5.x clients reach this broker's gRPC port at; unset while it is off.
    pub advertised: OnceLock<String>,
    /// The clients' Telemetry streams, by client id.
    pub sessions: Sessions,
    /// Messages received with `auto_renew`, kept invisible while their client is connected.
    pub(crate) renewals: renew::Renewals,
    /// The next queue a message without a message group goes to (modulo the queue count).
    pub(crate) send_sequence: std::sync::atomic::AtomicU32,
    /// Calls answered, by call and result code (`quiver_grpc_calls_total`).
    calls: parking_lot::Mutex<std::collections::BTreeMap<(&'static str, &'static str), u64>>,
}

impl GrpcState {
    /// Counts one answered call by the result code of its status.
    pub(crate) fn count(&self, call: &'static str, code: i32) {
        let code = Code::try_from(code).map_or("UNKNOWN", |code| code.as_str_name());
        *self.calls.lock().entry((call, code)).or_default() += 1;
    }

    /// ((call, code), calls answered so far).
    pub fn call_counts(&self) -> Vec<((&'static str, &'static str), u64)> {
        self.calls
            .lock()
            .iter()
            .map(|(key, count)| (*key, *count))
            .collect()
    }
}
