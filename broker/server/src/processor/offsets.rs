//! QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX/MIN_OFFSET (30/31),
//! SEARCH_OFFSET_BY_TIMESTAMP (29).

use quiver_protocol::header::{
    GetMaxOffsetRequestHeader, GetMinOffsetRequestHeader, QueryConsumerOffsetRequestHeader,
    SearchOffsetRequestHeader, UpdateConsumerOffsetRequestHeader,
};
use quiver_protocol::RemotingCommand;

use super::{queue_id, queue_offset, success, Ctx, Outcome};
use crate::broker::blocking;
use crate::service::consume;

pub fn query(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = QueryConsumerOffsetRequestHeader::from_command(req)?;
    let queue = queue_id(header.queue_id)?;
    let zero_allowed = header.set_zero_if_not_found != Some(false);
    let offset = consume::query_offset(
        &ctx.broker,
        &header.consumer_group,
        &header.topic,
        queue,
        zero_allowed,
    )?;
    Ok(success(req, &[("offset", offset.0.to_string())]))
}

/// Answered once the commit is as safe as a sent message; a replica refuses it (14
/// SERVICE_NOT_AVAILABLE, naming the master), as a send.
pub async fn update(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = UpdateConsumerOffsetRequestHeader::from_command(req)?;
    let queue = queue_id(header.queue_id)?;
    let offset = queue_offset("commitOffset", header.commit_offset)?;
    consume::commit_offset_durably(
        &ctx.broker,
        &header.consumer_group,
        &header.topic,
        queue,
        offset,
    )
    .await?;
    Ok(success(req, &[]))
}

pub fn max(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = GetMaxOffsetRequestHeader::from_command(req)?;
    let offset = ctx
        .broker
        .store()
        .max_offset(&header.topic, queue_id(header.queue_id)?);
    Ok(success(req, &[("offset", offset.0.to_string())]))
}

pub fn min(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = GetMinOffsetRequestHeader::from_command(req)?;
    let offset = ctx
        .broker
        .store()
        .min_offset(&header.topic, queue_id(header.queue_id)?);
    Ok(success(req, &[("offset", offset.0.to_string())]))
}

pub async fn search(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = SearchOffsetRequestHeader::from_command(req)?;
    let queue = queue_id(header.queue_id)?;
    let offset = blocking(&ctx.broker, move |broker| {
        broker
            .store()
            .search_offset_by_timestamp(&header.topic, queue, header.timestamp)
    })
    .await??;
    Ok(success(req, &[("offset", offset.0.to_string())]))
}
