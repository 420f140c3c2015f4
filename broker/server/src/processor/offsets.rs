//! QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX/MIN_OFFSET (30/31),
//! SEARCH_OFFSET_BY_TIMESTAMP (29).

use quiver_protocol::code::response;
use quiver_protocol::header::{
    GetMaxOffsetRequestHeader, GetMinOffsetRequestHeader, QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader, UpdateConsumerOffsetRequestHeader,
};
use quiver_protocol::RemotingCommand;

use std::sync::OnceLock;

use quiver_store::QueueOffset;

use super::{queue_id, queue_offset, success, Ctx, Outcome, Refusal};
use crate::broker::{blocking, Broker};

pub fn query(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = QueryConsumerOffsetRequestHeader::from_command(req)?;
    let queue = queue_id(header.queue_id)?;
    let broker = &ctx.broker;
    if let Some(offset) = broker
        .offsets
        .query(&header.consumer_group, &header.topic, queue)
    {
        return Ok(success(req, &[("offset", offset.0.to_string())]));
    }
    if let Some(replication) = &broker.replication {
        if !matches!(replication.role(), crate::replication::Role::Master { .. }) {
            // A replica may not have copied the group's offset yet (a wiped one never did):
            // only the master may say there is none, or a client starts the queue over.
            return Err(Refusal::new(
                response::SYSTEM_BUSY,
                format!(
                    "broker {} member {} is not the master and holds no offset of group {} for {}/{queue}; ask the master",
                    broker.config.broker_name, replication.id, header.consumer_group, header.topic
                ),
            ));
        }
    }
    let zero_allowed = header.set_zero_if_not_found != Some(false);
    if zero_allowed && queue_start_is_hot(broker, &header.topic, queue) {
        // Apache's answer: a new group reads a young queue from its start.
        return Ok(success(req, &[("offset", "0".to_string())]));
    }
    Err(Refusal::new(
        response::QUERY_NOT_FOUND,
        "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first",
    ))
}

/// Apache's test for answering 0 to a group with no offset: the queue still starts at 0 and
/// its first message (if any) is within the CommitLog's last 40% of physical memory.
fn queue_start_is_hot(broker: &Broker, topic: &str, queue: u32) -> bool {
    let store = &broker.store;
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

pub fn update(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = UpdateConsumerOffsetRequestHeader::from_command(req)?;
    let queue = queue_id(header.queue_id)?;
    let offset = queue_offset("commitOffset", header.commit_offset)?;
    ctx.broker
        .commit_consumer_offset(&header.consumer_group, &header.topic, queue, offset);
    Ok(success(req, &[]))
}

pub fn max(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = GetMaxOffsetRequestHeader::from_command(req)?;
    let offset = ctx
        .broker
        .store
        .max_offset(&header.topic, queue_id(header.queue_id)?);
    Ok(success(req, &[("offset", offset.0.to_string())]))
}

pub fn min(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = GetMinOffsetRequestHeader::from_command(req)?;
    let offset = ctx
        .broker
        .store
        .min_offset(&header.topic, queue_id(header.queue_id)?);
    Ok(success(req, &[("offset", offset.0.to_string())]))
}

pub async fn search(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = SearchOffsetRequestHeader::from_command(req)?;
    let queue = queue_id(header.queue_id)?;
    let offset = blocking(&ctx.broker, move |broker| {
        broker
            .store
            .search_offset_by_timestamp(&header.topic, queue, header.timestamp)
    })
    .await??;
    Ok(success(req, &[("offset", offset.0.to_string())]))
}
