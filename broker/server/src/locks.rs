//! Queue locks for orderly consumers (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).

use std::collections::HashMap;

use parking_lot::Mutex;

/// A lock not renewed for this long may be taken by another client (RocketMQ's 60 s).
pub const LOCK_EXPIRY_MS: i64 = 60_000;

/// (group, topic, brokerName, queueId) identifying a locked queue.
pub type LockKey = (String, String, String, u32);

#[derive(Default)]
pub struct QueueLocks {
    held: Mutex<HashMap<LockKey, (String, i64)>>,
}

impl QueueLocks {
    /// Locks (or renews) each queue for `client_id`; returns those it now holds.
    pub fn lock(&self, client_id: &str, queues: Vec<LockKey>, now_ms: i64) -> Vec<LockKey> {
        let mut held = self.held.lock();
        let mut granted = Vec::new();
        for key in queues {
            let free = match held.get(&key) {
                Some((owner, at)) => owner == client_id || now_ms - at > LOCK_EXPIRY_MS,
                None => true,
            };
            if free {
                held.insert(key.clone(), (client_id.to_string(), now_ms));
                granted.push(key);
            }
        }
        granted
    }

    /// Releases the queues that `client_id` holds.
    pub fn unlock(&self, client_id: &str, queues: &[LockKey]) {
        let mut held = self.held.lock();
        for key in queues {
            if held.get(key).is_some_and(|(owner, _)| owner == client_id) {
                held.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(q: u32) -> LockKey {
        ("G".into(), "T".into(), "b".into(), q)
    }

    #[test]
    fn one_owner_until_expiry() {
        let locks = QueueLocks::default();
        assert_eq!(locks.lock("a", vec![key(0), key(1)], 0).len(), 2);
        assert!(locks.lock("b", vec![key(0)], 1_000).is_empty());
        assert_eq!(
            locks.lock("b", vec![key(0)], LOCK_EXPIRY_MS + 1),
            vec![key(0)]
        );
        locks.unlock("a", &[key(1)]);
        assert_eq!(locks.lock("b", vec![key(1)], 2), vec![key(1)]);
    }
}
