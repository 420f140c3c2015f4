//! QUERY_MESSAGE (12) by key or unique key within a time range, VIEW_MESSAGE_BY_ID (33) by
//! CommitLog offset, GET_EARLIEST_MSG_STORETIME (32).

use quiver_protocol::code::response;
use quiver_protocol::header::{
    GetEarliestMsgStoretimeRequestHeader, GetEarliestMsgStoretimeResponseHeader,
    QueryMessageRequestHeader, QueryMessageResponseHeader, ViewMessageRequestHeader,
    UNIQUE_KEY_QUERY_FLAG,
};
use quiver_protocol::RemotingCommand;
use quiver_store::{CommitLogOffset, KeyMatch};

use super::{queue_id, Ctx, Outcome, Refusal};
use crate::broker::blocking;

/// Messages one query returns at most, whatever `maxNum` asks (Apache's `maxMsgsNumBatch`).
pub const MAX_MESSAGES_PER_QUERY: i32 = 64;
/// Messages a query by unique key returns at most (Apache's `defaultQueryMaxNum`): a message
/// id names one message, stored again only by retries.
pub const MAX_MESSAGES_PER_UNIQUE_KEY_QUERY: i32 = 32;

pub async fn query_message(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = QueryMessageRequestHeader::from_command(req)?;
    let by_unique_key = req
        .ext(UNIQUE_KEY_QUERY_FLAG)
        .is_some_and(|flag| flag.trim().eq_ignore_ascii_case("true"));
    let (key_match, max_num) = if by_unique_key {
        (KeyMatch::UniqueKey, MAX_MESSAGES_PER_UNIQUE_KEY_QUERY)
    } else {
        (KeyMatch::AnyKey, header.max_num.min(MAX_MESSAGES_PER_QUERY))
    };
    let QueryMessageRequestHeader {
        topic,
        key,
        begin_timestamp,
        end_timestamp,
        ..
    } = header;
    let found = blocking(&ctx.broker, move |broker| {
        broker.store().query_by_key(
            &topic,
            &key,
            key_match,
            usize::try_from(max_num).unwrap_or(0),
            begin_timestamp,
            end_timestamp,
        )
    })
    .await?;
    let progress = QueryMessageResponseHeader {
        index_last_update_timestamp: found.index.last_timestamp_ms,
        index_last_update_phyoffset: i64::try_from(found.index.last_physical_offset)
            .unwrap_or(i64::MAX),
    };
    let (code, remark) = if found.messages.is_empty() {
        (
            response::QUERY_NOT_FOUND,
            Some("can not find message, maybe time range not correct".to_owned()),
        )
    } else {
        (response::SUCCESS, None)
    };
    let mut reply = req
        .response_to(code, remark)
        .with_ext_fields(progress.to_ext());
    // The records go out as they are stored (mapped views), back to back.
    reply.body_chain = found.messages;
    Ok(reply)
}

pub async fn view_message(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = ViewMessageRequestHeader::from_command(req)?;
    let not_found = |detail: String| {
        Refusal::new(
            response::SYSTEM_ERROR,
            format!(
                "can not find message by the offset, {}{detail}",
                header.offset
            ),
        )
    };
    let offset = u64::try_from(header.offset).map_err(|_| not_found(String::new()))?;
    let record = blocking(&ctx.broker, move |broker| {
        broker.store().message_at(CommitLogOffset(offset))
    })
    .await?
    .map_err(|error| not_found(format!(": {}", crate::error::chain(&error))))?;
    let mut reply = req.response_to(response::SUCCESS, None);
    reply.body_chain = vec![record];
    Ok(reply)
}

pub async fn earliest_store_time(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = GetEarliestMsgStoretimeRequestHeader::from_command(req)?;
    let queue = queue_id(header.queue_id)?;
    let topic = header.topic;
    let stored = blocking(&ctx.broker, move |broker| {
        broker.store().earliest_store_timestamp(&topic, queue)
    })
    .await??;
    // Apache answers -1 for an empty or unknown queue.
    let reply = GetEarliestMsgStoretimeResponseHeader {
        timestamp: stored.unwrap_or(-1),
    };
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_ext_fields(reply.to_ext()))
}
