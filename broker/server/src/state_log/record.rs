//! The state log's record: one change of consumer-group state as the body of a message of
//! [`super::STATE_TOPIC`], JSON tagged by `kind` so a member skips kinds it does not know.

use serde::{Deserialize, Serialize};

/// One queue's next offset. A list of these rather than a map: an internally tagged enum
/// cannot read integer map keys back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueCommit {
    pub queue_id: u32,
    pub offset: u64,
}

/// One change, applied in log order by every member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum StateRecord {
    /// Committed (or reset) offsets of one group on one topic.
    #[serde(rename_all = "camelCase")]
    Commit {
        group: String,
        topic: String,
        offsets: Vec<QueueCommit>,
    },
    /// A subscription group deleted, with its committed offsets when `drop_offsets`.
    #[serde(rename_all = "camelCase")]
    DeleteGroup { group: String, drop_offsets: bool },
    /// A record of the master's POP state (`quiver_store::PopState`'s own log record).
    Pop { record: serde_json::Value },
    /// Timed messages the master re-stored to their real queues, by their queue offsets in
    /// the timer topic (the same on every member, unlike the timer log's indexes).
    #[serde(rename_all = "camelCase")]
    TimerFired { queue_offsets: Vec<u64> },
}

impl StateRecord {
    pub fn commit(group: &str, topic: &str, offsets: impl IntoIterator<Item = (u32, u64)>) -> Self {
        StateRecord::Commit {
            group: group.to_owned(),
            topic: topic.to_owned(),
            offsets: offsets
                .into_iter()
                .map(|(queue_id, offset)| QueueCommit { queue_id, offset })
                .collect(),
        }
    }

    /// The POP state's record whose JSON payload is `payload`; None if it is not JSON.
    pub fn pop(payload: &[u8]) -> Option<Self> {
        serde_json::from_slice(payload)
            .ok()
            .map(|record| StateRecord::Pop { record })
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a state record always serializes")
    }

    pub fn decode(body: &[u8]) -> Result<StateRecord, serde_json::Error> {
        serde_json::from_slice(body)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_in_their_documented_form() {
        let commit = StateRecord::commit("g", "T", [(0, 12), (3, 40)]);
        let body = commit.encode();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"kind":"commit","group":"g","topic":"T","offsets":[{"queueId":0,"offset":12},{"queueId":3,"offset":40}]}"#
        );
        assert_eq!(StateRecord::decode(&body).unwrap(), commit);
        let delete = StateRecord::DeleteGroup {
            group: "g".into(),
            drop_offsets: true,
        };
        let body = delete.encode();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"kind":"deleteGroup","group":"g","dropOffsets":true}"#
        );
        assert_eq!(StateRecord::decode(&body).unwrap(), delete);
    }

    #[test]
    fn a_pop_record_carries_the_pop_states_own_payload() {
        let payload = br#"{"op":"Remove","key":{"g":"g","t":"T","q":0},"offset":4}"#;
        let record = StateRecord::pop(payload).unwrap();
        let decoded = StateRecord::decode(&record.encode()).unwrap();
        let StateRecord::Pop { record: inner } = decoded else {
            panic!("a pop record decodes as one");
        };
        let original: serde_json::Value = serde_json::from_slice(payload).unwrap();
        assert_eq!(inner, original);
    }

    #[test]
    fn a_timer_fired_record_names_timer_queue_offsets() {
        let fired = StateRecord::TimerFired {
            queue_offsets: vec![3, 4, 9],
        };
        let body = fired.encode();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            r#"{"kind":"timerFired","queueOffsets":[3,4,9]}"#
        );
        assert_eq!(StateRecord::decode(&body).unwrap(), fired);
    }

    #[test]
    fn unknown_kinds_and_foreign_bodies_do_not_decode() {
        assert!(StateRecord::decode(br#"{"kind":"fromTheFuture","x":1}"#).is_err());
        assert!(StateRecord::decode(b"hello").is_err());
    }
}
