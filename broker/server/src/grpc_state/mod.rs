//! What the broker keeps for its gRPC port: the endpoint it advertises, its 5.x clients'
//! Telemetry sessions (`sessions.rs`), the received messages renewed for them
//! (`renewals.rs`), the round-robin of sends and the calls answered by code. State only: it
//! imports neither the broker nor the port, as `crate::pop` keeps POP's state. The port
//! (`crate::grpc`) serves over it and registers how a transaction check-back reaches a 5.x
//! producer, which the check-back loop (`crate::delivery::check_back`) asks through
//! [`GrpcState::check_back`] without knowing the port.

mod renewals;
mod sessions;

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU32;
use std::sync::OnceLock;

use parking_lot::Mutex;
use quiver_grpc_proto::v2::Code;
use quiver_protocol::RemotingCommand;

pub(crate) use renewals::Received;
pub use renewals::Renewals;
pub(crate) use sessions::Outbound;
pub use sessions::Sessions;

/// How the gRPC port hands a CHECK_TRANSACTION_STATE (for the half message's producer
/// group) to a 5.x producer: true when one took it.
pub(crate) type CheckBack = fn(&GrpcState, &str, &RemotingCommand) -> bool;

/// What the gRPC side shares with the rest of the broker.
#[derive(Default)]
pub struct GrpcState {
    /// host:port 5.x clients reach this broker's gRPC port at; unset while it is off.
    pub advertised: OnceLock<String>,
    /// The clients' Telemetry streams, by client id.
    pub sessions: Sessions,
    /// Messages received with `auto_renew`, kept invisible while their client is connected.
    pub(crate) renewals: Renewals,
    /// The next queue a message without a message group goes to (modulo the queue count).
    pub(crate) send_sequence: AtomicU32,
    /// Calls answered, by call and result code (`quiver_grpc_calls_total`).
    calls: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    /// Set by the port when it serves.
    check_back: OnceLock<CheckBack>,
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

    /// How check-backs reach 5.x producers from now on (the port, as it starts serving).
    pub(crate) fn serve_check_backs(&self, check_back: CheckBack) {
        let _ = self.check_back.set(check_back);
    }

    /// Sends a CHECK_TRANSACTION_STATE of the check-back loop to a 5.x producer of
    /// `producer_group`; false while the port is off, or when no such producer took it.
    pub(crate) fn check_back(&self, producer_group: &str, check: &RemotingCommand) -> bool {
        self.check_back
            .get()
            .is_some_and(|check_back| check_back(self, producer_group, check))
    }
}
