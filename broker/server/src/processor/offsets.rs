//! QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX/MIN_OFFSET (30/31),
//! SEARCH_OFFSET_BY_TIMESTAMP (29).

use quiver_protocol::code::response;
use quiver_protocol::RemotingCommand;

use super::{success, Ctx, Fields, Outcome, Refusal};
use crate::broker::blocking;

pub fn query(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let group = f.str("consumerGroup")?;
    let topic = f.str("topic")?;
    let queue_id = f.queue_id("queueId")?;
    match ctx.broker.offsets.query(group, topic, queue_id) {
        Some(offset) => Ok(success(req, &[("offset", offset.0.to_string())])),
        None => Err(Refusal::new(
            response::QUERY_NOT_FOUND,
            format!("no committed offset for group {group} on {topic}:{queue_id}"),
        )),
    }
}

pub fn update(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let group = f.str("consumerGroup")?;
    let topic = f.str("topic")?;
    let queue_id = f.queue_id("queueId")?;
    let offset = f.offset("commitOffset")?;
    ctx.broker.offsets.commit(group, topic, queue_id, offset);
    Ok(success(req, &[]))
}

pub fn max(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let offset = ctx
        .broker
        .store
        .max_offset(f.str("topic")?, f.queue_id("queueId")?);
    Ok(success(req, &[("offset", offset.0.to_string())]))
}

pub fn min(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let offset = ctx
        .broker
        .store
        .min_offset(f.str("topic")?, f.queue_id("queueId")?);
    Ok(success(req, &[("offset", offset.0.to_string())]))
}

pub async fn search(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let f = Fields(req);
    let topic = f.str("topic")?.to_string();
    let queue_id = f.queue_id("queueId")?;
    let timestamp_ms: i64 = f.parse("timestamp")?;
    let offset = blocking(&ctx.broker, move |broker| {
        broker
            .store
            .search_offset_by_timestamp(&topic, queue_id, timestamp_ms)
    })
    .await??;
    Ok(success(req, &[("offset", offset.0.to_string())]))
}
