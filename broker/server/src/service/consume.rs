//! Consuming: consumer groups' offsets, and the checks a pull passes before it reads.

use std::sync::OnceLock;

use quiver_store::QueueOffset;

use super::ServiceError;
use crate::broker::Broker;
use crate::state_log::{self, StateRecord};
use crate::topics::TopicConfig;

/// Commits a consumer group's offset as a pull asks (its commit flag): through the state
/// log, without waiting for durability, and only on a member that takes writes (clients
/// set the flag only towards the master). An unchanged offset writes nothing.
pub fn commit_offset(
    broker: &Broker,
    group: &str,
    topic: &str,
    queue_id: u32,
    offset: QueueOffset,
) {
    if !broker.takes_writes() {
        return;
    }
    let offset = clamp_to_written(broker, topic, queue_id, offset);
    if broker.offsets().query(group, topic, queue_id) == Some(offset) {
        return;
    }
    let record = StateRecord::commit(group, topic, [(queue_id, offset.0)]);
    if let Err(error) = state_log::append(broker, &record) {
        tracing::debug!(error = %crate::error::chain(&error), group, topic, queue_id, "offset commit of a pull not written");
    }
}

/// Commits a consumer group's offset (UPDATE_CONSUMER_OFFSET), answered once it is as safe
/// as a sent message (flushed with the flush mode, held by a sync group's in-sync members).
/// A member that takes no writes refuses it, naming the master.
pub async fn commit_offset_durably(
    broker: &Broker,
    group: &str,
    topic: &str,
    queue_id: u32,
    offset: QueueOffset,
) -> Result<(), ServiceError> {
    let offset = clamp_to_written(broker, topic, queue_id, offset);
    let end = match broker.offsets().query(group, topic, queue_id) == Some(offset) {
        // Already committed: answered once whatever wrote it is as safe.
        true if broker.takes_writes() => broker.store().log_end(),
        _ => {
            let record = StateRecord::commit(group, topic, [(queue_id, offset.0)]);
            state_log::append(broker, &record)?
        }
    };
    state_log::wait_held(broker, end).await
}

/// On a group member at most the end of what it wrote to the queue: a consumer that read a
/// tail this member does not have (a deposed master's) must not move the group past
/// messages the group may still write there.
fn clamp_to_written(
    broker: &Broker,
    topic: &str,
    queue_id: u32,
    offset: QueueOffset,
) -> QueueOffset {
    match &broker.replication() {
        Some(_) => offset.min(broker.store().written_max_offset(topic, queue_id)),
        None => offset,
    }
}

/// The group's committed offset of the queue; with none, 0 for a young queue when
/// `zero_allowed` (Apache's answer: a new group reads it from its start). A replica without
/// the offset is busy rather than sure there is none: only the master may say so.
pub fn query_offset(
    broker: &Broker,
    group: &str,
    topic: &str,
    queue: u32,
    zero_allowed: bool,
) -> Result<QueueOffset, ServiceError> {
    if let Some(offset) = broker.offsets().query(group, topic, queue) {
        return Ok(offset);
    }
    if let Some(replication) = &broker.replication() {
        if !matches!(replication.role(), crate::replication::Role::Master { .. }) {
            // A replica may not have copied the group's offset yet (a wiped one never did):
            // only the master may say there is none, or a client starts the queue over.
            return Err(ServiceError::Busy(format!(
                "broker {} member {} is not the master and holds no offset of group {group} for {topic}/{queue}; ask the master",
                broker.config().broker_name, replication.id
            )));
        }
    }
    if zero_allowed && queue_start_is_hot(broker, topic, queue) {
        return Ok(QueueOffset(0));
    }
    Err(ServiceError::NotFound(
        "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first".into(),
    ))
}

/// Apache's test for answering 0 to a group with no offset: the queue still starts at 0 and
/// its first message (if any) is within the CommitLog's last 40% of physical memory.
fn queue_start_is_hot(broker: &Broker, topic: &str, queue: u32) -> bool {
    let store = broker.store();
    if store.min_offset(topic, queue).0 > 0 {
        return false;
    }
    let Some(first) = store.physical_offset_at(topic, queue, QueueOffset(0)) else {
        return true;
    };
    let behind = store.stats().max_physical_offset.0.saturating_sub(first.0);
    behind <= hot_window_bytes()
}

/// Apache's `accessMessageInMemoryMaxRatio` (40) of the machine's memory; 0 when unknown.
fn hot_window_bytes() -> u64 {
    static WINDOW: OnceLock<u64> = OnceLock::new();
    *WINDOW.get_or_init(|| physical_memory_bytes().unwrap_or(0) / 100 * 40)
}

/// MemTotal from /proc/meminfo, in bytes.
fn physical_memory_bytes() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

pub fn check_broker_readable(broker: &Broker) -> Result<(), ServiceError> {
    if broker.is_readable() {
        return Ok(());
    }
    Err(ServiceError::Forbidden(format!(
        "broker {} is not readable",
        broker.config().broker_name
    )))
}

/// The topic a group pulls from, when it exists, the queue is one of it and the group is
/// not disabled.
pub fn pull_topic(
    broker: &Broker,
    group: &str,
    topic: &str,
    queue_id: u32,
) -> Result<TopicConfig, ServiceError> {
    let Some(config) = broker.topics().get(topic) else {
        return Err(ServiceError::TopicNotFound(format!(
            "topic {topic} does not exist"
        )));
    };
    if queue_id >= config.read_queue_nums.max(config.write_queue_nums) {
        return Err(ServiceError::BadRequest(format!(
            "queueId {queue_id} is out of range for topic {topic} ({} queues)",
            config.read_queue_nums
        )));
    }
    if let Some(found) = broker.groups().get(group) {
        if !found.consume_enable {
            return Err(ServiceError::Forbidden(format!(
                "consumer group {group} is disabled"
            )));
        }
    }
    Ok(config)
}
