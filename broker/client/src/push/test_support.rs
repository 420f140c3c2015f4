//! Messages for the push consumer's unit tests.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use bytes::Bytes;
use quiver_protocol::offset::{CommitLogOffset, QueueOffset};

use crate::message::ReceivedMessage;
use crate::MessageQueue;

pub(super) fn queue() -> MessageQueue {
    MessageQueue::new("T", "broker-a", 0)
}

/// A message of [`queue`] at `offset`, 100 bytes, never redelivered.
pub(super) fn message(offset: u64) -> ReceivedMessage {
    let host: SocketAddr = ([127, 0, 0, 1], 10911).into();
    ReceivedMessage {
        topic: "T".to_owned(),
        queue: queue(),
        queue_offset: QueueOffset(offset),
        commit_log_offset: CommitLogOffset(offset * 100),
        body: Bytes::from(format!("body {offset}")),
        flag: 0,
        sys_flag: 0,
        properties: BTreeMap::new(),
        reconsume_times: 0,
        born_timestamp_ms: 0,
        born_host: host,
        store_timestamp_ms: 0,
        store_host: host,
        size_bytes: 100,
    }
}

pub(super) fn messages(offsets: impl IntoIterator<Item = u64>) -> Vec<ReceivedMessage> {
    offsets.into_iter().map(message).collect()
}
