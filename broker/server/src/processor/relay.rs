//! GET_CONSUMER_RUNNING_INFO (307) and CONSUME_MESSAGE_DIRECTLY (309): relayed to the named
//! consumer over its own connection and its answer returned as it is, as Apache's
//! `callConsumer` does; a consumer that does not answer in time is CONSUME_MSG_TIMEOUT.

use std::time::Duration;

use bytes::Bytes;
use quiver_protocol::code::response;
use quiver_protocol::header::{
    ConsumeMessageDirectlyResultRequestHeader, GetConsumerRunningInfoRequestHeader,
};
use quiver_protocol::message::decode_offset_msg_id;
use quiver_protocol::{CommitLogOffset, RemotingCommand};
use quiver_remoting::ConnectionError;

use super::{Ctx, Outcome, Refusal};

/// How long a consumer may take to answer (Apache's `Broker2Client.callClient`).
const CONSUMER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn consumer_running_info(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = GetConsumerRunningInfoRequestHeader::from_command(req)?;
    call_consumer(
        ctx,
        req,
        &header.consumer_group,
        &header.client_id,
        req.body.clone(),
    )
    .await
}

/// The consumer is sent the stored message `msgId` names, to consume it at once.
pub async fn consume_message_directly(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = ConsumeMessageDirectlyResultRequestHeader::from_command(req)?;
    let msg_id = header.msg_id.unwrap_or_default();
    let record = decode_offset_msg_id(&msg_id)
        .ok()
        .and_then(|(_, offset)| {
            ctx.broker
                .store()
                .read_record_bytes(CommitLogOffset(offset))
                .ok()
        })
        .ok_or_else(|| {
            Refusal::new(
                response::SYSTEM_ERROR,
                format!("no message with id {msg_id} is stored on this broker"),
            )
        })?;
    let mut relayed = req.clone();
    relayed
        .ext_fields
        .insert("brokerName", ctx.broker.config().broker_name.clone());
    let client_id = header.client_id.unwrap_or_default();
    call_consumer(ctx, &relayed, &header.consumer_group, &client_id, record).await
}

async fn call_consumer(
    ctx: &Ctx,
    req: &RemotingCommand,
    group: &str,
    client_id: &str,
    body: Bytes,
) -> Outcome {
    let client = ctx
        .broker
        .consumers()
        .group(group)
        .and_then(|state| state.clients.get(client_id).cloned())
        .ok_or_else(|| {
            Refusal::new(
                response::SYSTEM_ERROR,
                format!("The Consumer <{group}> <{client_id}> not online"),
            )
        })?;
    let request = RemotingCommand::request(req.code, req.ext_fields.clone()).with_body(body);
    let connection = &client.connection.remoting;
    match connection.request(request, CONSUMER_CALL_TIMEOUT).await {
        Ok(answer) => Ok(RemotingCommand {
            opaque: req.opaque,
            serialize_type: req.serialize_type,
            ..answer
        }),
        Err(error @ ConnectionError::Timeout { .. }) => Err(Refusal::new(
            response::CONSUME_MSG_TIMEOUT,
            format!("consumer <{group}> <{client_id}> Timeout: {error}"),
        )),
        Err(error) => Err(Refusal::new(
            response::SYSTEM_ERROR,
            format!("invoke consumer <{group}> <{client_id}> Exception: {error}"),
        )),
    }
}
