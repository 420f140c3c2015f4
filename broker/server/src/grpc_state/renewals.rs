//! `auto_renew` receives (what the 5.x PushConsumer sends): as Apache's Proxy does, the broker
//! keeps such a message invisible while its client's Telemetry stream is open, renewing it a
//! third of its invisible time before it would come back, for at most 12 hours. The
//! client keeps the handle it received; its ack, change or forward is applied to the latest
//! renewed handle and ends the renewing. A client gone lets its messages come back in time.
//! The renewals are kept here; the gRPC port's loop (`crate::grpc`'s `renew.rs`) renews what
//! is due through the POP service.

use std::collections::HashMap;
use std::time::Duration;

use parking_lot::Mutex;

use super::Sessions;
use crate::pop::PopError;

/// How long a message is kept invisible for a client that holds it (Apache's 12 h bound on
/// any invisible time).
const MAX_RENEWING_MS: i64 = 12 * 3600 * 1000;

/// One message renewed for its client.
#[derive(Clone)]
struct Renewal {
    client_id: String,
    group: String,
    topic: String,
    /// The handle that works now (the received one until the first renewal).
    current: String,
    invisible_ms: i64,
    invisible_until_ms: i64,
    received_ms: i64,
}

/// The messages kept invisible for their clients, by the handle the client received.
#[derive(Default)]
pub struct Renewals {
    by_handle: Mutex<HashMap<String, Renewal>>,
}

/// A received message to renew.
pub(crate) struct Received<'a> {
    pub client_id: &'a str,
    pub group: &'a str,
    pub topic: &'a str,
    pub handle: &'a str,
    pub invisible_ms: i64,
    pub invisible_until_ms: i64,
}

impl Renewals {
    pub(crate) fn track(&self, received: Received<'_>, now_ms: i64) {
        let renewal = Renewal {
            client_id: received.client_id.to_owned(),
            group: received.group.to_owned(),
            topic: received.topic.to_owned(),
            current: received.handle.to_owned(),
            invisible_ms: received.invisible_ms,
            invisible_until_ms: received.invisible_until_ms,
            received_ms: now_ms,
        };
        self.by_handle
            .lock()
            .insert(received.handle.to_owned(), renewal);
    }

    /// Runs `act` on the handle that works for the client's `handle` (itself when it is not
    /// renewed) and stops renewing it. Once removed (a renewal pass holds the lock throughout,
    /// so the removal sees its result) nothing replaces the handle: `act` runs unlocked, and
    /// acks do not queue behind one another. Blocking when `act` is.
    pub(crate) fn settle<T>(&self, handle: &str, act: impl FnOnce(&str) -> T) -> T {
        let renewed = self.by_handle.lock().remove(handle).map(|r| r.current);
        act(renewed.as_deref().unwrap_or(handle))
    }

    /// [`Renewals::settle`] for a batch under one lock: the handle to act on for each of
    /// `handles`, in order; none of them is renewed from now on.
    pub(crate) fn settle_all(&self, handles: &[String]) -> Vec<String> {
        let mut renewals = self.by_handle.lock();
        handles
            .iter()
            .map(|handle| {
                renewals
                    .remove(handle)
                    .map_or_else(|| handle.clone(), |r| r.current)
            })
            .collect()
    }

    /// Messages renewed for their clients now.
    pub fn len(&self) -> usize {
        self.by_handle.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Renews what is due at `now_ms` for clients with a session in `sessions`, by
    /// `renew(group, topic, current handle, invisible time)` (the new handle); forgets the
    /// others. Blocking when `renew` is.
    pub(crate) fn renew_due(
        &self,
        sessions: &Sessions,
        now_ms: i64,
        mut renew: impl FnMut(&str, &str, &str, Duration) -> Result<String, PopError>,
    ) {
        let mut renewals = self.by_handle.lock();
        renewals.retain(|_, renewal| {
            if renewal.invisible_until_ms - now_ms > renewal.invisible_ms / 3 {
                return true;
            }
            let connected = sessions.contains(&renewal.client_id);
            if !connected || now_ms - renewal.received_ms >= MAX_RENEWING_MS {
                return false;
            }
            let invisible = Duration::from_millis(renewal.invisible_ms.max(0) as u64);
            match renew(&renewal.group, &renewal.topic, &renewal.current, invisible) {
                Ok(handle) => {
                    renewal.current = handle;
                    renewal.invisible_until_ms = now_ms + renewal.invisible_ms;
                    true
                }
                // Acked, dead-lettered or revived meanwhile: nothing left to renew.
                Err(PopError::HandleExpired | PopError::InvalidHandle) => false,
                Err(error) => {
                    tracing::warn!(error = %crate::error::chain(&error), "renewing a received message failed; retried");
                    true
                }
            }
        });
    }
}
