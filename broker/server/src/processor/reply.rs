//! Request-reply: SEND_REPLY_MESSAGE (324) and SEND_REPLY_MESSAGE_V2 (325) carry a consumer's
//! reply; it is pushed to the requesting producer (property REPLY_TO_CLIENT, found in the
//! producer table) with PUSH_REPLY_MESSAGE_TO_CLIENT (326), and the answer says whether it got
//! there, as Apache's `ReplyMessageProcessor`. Replies are not stored (Apache with
//! `storeReplyMessageEnable=false`): the answer's msgId is "0".

use std::time::Duration;

use quiver_protocol::code::{request, response};
use quiver_protocol::header::{
    ReplyMessageRequestHeader, SendMessageRequestHeader, SendMessageResponseHeader,
};
use quiver_protocol::message as msg;
use quiver_protocol::RemotingCommand;
use quiver_store::record::{encode_properties, parse_properties, property};

use super::{Ctx, Outcome, Refusal};

/// How long the requester may take to take the reply (Apache's `callClient`).
const REQUESTER_CALL_TIMEOUT: Duration = Duration::from_secs(10);

pub async fn send_reply(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = match req.code {
        request::SEND_REPLY_MESSAGE_V2 => SendMessageRequestHeader::from_v2_ext(&req.ext_fields)?,
        _ => SendMessageRequestHeader::from_ext(&req.ext_fields)?,
    };
    let properties = header.properties.clone().unwrap_or_default();
    let requester = property(&properties, msg::PROPERTY_MESSAGE_REPLY_TO_CLIENT)
        .filter(|id| !id.is_empty())
        .ok_or_else(|| {
            Refusal::new(
                response::SYSTEM_ERROR,
                format!(
                    "reply message properties[{}] is null",
                    msg::PROPERTY_MESSAGE_REPLY_TO_CLIENT
                ),
            )
        })?
        .to_owned();
    let producer = ctx.broker.producers().find(&requester).ok_or_else(|| {
        Refusal::new(
            response::SYSTEM_ERROR,
            format!("push reply message fail, channel of <{requester}> not found."),
        )
    })?;
    let push = RemotingCommand::request(
        request::PUSH_REPLY_MESSAGE_TO_CLIENT,
        push_header(ctx, &header, &properties).to_ext(),
    )
    .with_body(req.body.clone());
    let connection = &producer.connection.remoting;
    let pushed = connection.request(push, REQUESTER_CALL_TIMEOUT).await;
    match pushed {
        Ok(answer) if answer.code == response::SUCCESS => {}
        Ok(answer) => {
            tracing::warn!(requester, remark = ?answer.remark, "the requester refused a reply");
            return Err(push_failed(&requester));
        }
        Err(error) => {
            tracing::warn!(requester, %error, "could not push a reply");
            return Err(push_failed(&requester));
        }
    }
    let reply = SendMessageResponseHeader {
        msg_id: "0".to_owned(),
        queue_id: header.queue_id,
        queue_offset: 0,
        transaction_id: None,
    };
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_ext_fields(reply.to_ext()))
}

fn push_failed(requester: &str) -> Refusal {
    Refusal::new(
        response::SYSTEM_ERROR,
        format!("push reply message to {requester} fail."),
    )
}

/// The reply's header as the requester reads it, with the push time added to its properties.
fn push_header(
    ctx: &Ctx,
    header: &SendMessageRequestHeader,
    properties: &str,
) -> ReplyMessageRequestHeader {
    let now = crate::now_ms();
    let mut pairs = parse_properties(properties);
    pairs.insert(msg::PROPERTY_PUSH_REPLY_TIME.to_owned(), now.to_string());
    let properties = encode_properties(pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    ReplyMessageRequestHeader {
        producer_group: header.producer_group.clone(),
        topic: header.topic.clone(),
        default_topic: header.default_topic.clone(),
        default_topic_queue_nums: header.default_topic_queue_nums,
        queue_id: header.queue_id,
        sys_flag: header.sys_flag,
        born_timestamp: header.born_timestamp,
        flag: header.flag,
        properties: Some(properties),
        reconsume_times: header.reconsume_times,
        unit_mode: header.unit_mode,
        born_host: ctx.connection.remote.to_string(),
        store_host: ctx.broker.store_host().to_string(),
        store_timestamp: now,
    }
}
