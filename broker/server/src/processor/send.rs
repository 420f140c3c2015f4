//! SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320).

use std::net::SocketAddr;

use bytes::Bytes;
use quiver_protocol::code::response;
use quiver_protocol::header::{SendMessageRequestHeader, SendMessageResponseHeader};
use quiver_protocol::message::{self as msg, BatchMessage};
use quiver_protocol::RemotingCommand;
use quiver_store::record::{encode_properties, parse_properties, property};

use super::{Ctx, Outcome, Refusal};
use crate::broker::Broker;
use crate::service::produce::{
    check_body, check_broker_writable, half_message, is_half_message, park_if_delayed,
    refuse_batch_delay, refuse_batch_half, store_message_async, topic_for_send, StoreTarget,
};
use crate::topics::{DLQ_PREFIX, RETRY_PREFIX};

pub async fn handle(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let mut header = SendMessageRequestHeader::from_request(req)?;
    let properties_text = header.properties.take().unwrap_or_default();
    check_broker_writable(broker)?;
    let topic = topic_for_send(broker, &header.topic)?;
    if topic.perm & quiver_protocol::body::perm::WRITE == 0 {
        return Err(Refusal::new(
            response::NO_PERMISSION,
            format!("topic {} is not writable", header.topic),
        ));
    }
    let queue_id = match u32::try_from(header.queue_id) {
        Ok(id) if id < topic.write_queue_nums => id,
        Ok(id) => id % topic.write_queue_nums.max(1),
        Err(_) => (crate::now_ms() as u32) % topic.write_queue_nums.max(1),
    };
    let sending = Sending {
        header: &header,
        properties: &properties_text,
        queue_id,
        born_host: ctx.connection.remote,
        max_body: broker.config().max_message_size as usize,
    };
    let targets = if header.is_batch() {
        sending.batch_targets(&req.body)?
    } else {
        vec![sending.single_target(broker, &req.body)?]
    };
    let results = store_message_async(broker, &targets).await?;
    let ids: Vec<String> = results
        .iter()
        .map(|r| msg::offset_msg_id(broker.store_host(), r.physical_offset.0))
        .collect();
    tracing::trace!(topic = %header.topic, count = targets.len(), "stored");
    // The answer names the queue the client chose, even when a delay parks the message or
    // it waits as a half message (whose queue offset, in the half queue, the END names).
    let transaction_id = sending
        .is_half()
        .then(|| property(&targets[0].properties, msg::PROPERTY_UNIQ_KEY).map(str::to_owned))
        .flatten();
    let reply = SendMessageResponseHeader {
        msg_id: ids.join(","),
        queue_id: i32::try_from(queue_id).unwrap_or(i32::MAX),
        queue_offset: i64::try_from(results[0].queue_offset.0).unwrap_or(i64::MAX),
        transaction_id,
    };
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_ext_fields(reply.to_ext()))
}

/// One send request, checked, on its way to the store.
struct Sending<'a> {
    header: &'a SendMessageRequestHeader,
    properties: &'a str,
    queue_id: u32,
    born_host: SocketAddr,
    max_body: usize,
}

impl Sending<'_> {
    /// The messages of a batch body, each with the request's properties merged in.
    fn batch_targets(&self, body: &Bytes) -> Result<Vec<StoreTarget>, Refusal> {
        let batch = msg::decode_batch(body).map_err(|e| {
            Refusal::new(
                response::MESSAGE_ILLEGAL,
                format!("batch body is malformed: {e}"),
            )
        })?;
        if batch.is_empty() {
            return Err(Refusal::new(response::MESSAGE_ILLEGAL, "batch is empty"));
        }
        refuse_batch_delay(self.properties)?;
        refuse_batch_half(self.header.sys_flag, self.properties)?;
        let mut targets = Vec::with_capacity(batch.len());
        for BatchMessage {
            body,
            flag,
            properties,
            ..
        } in batch
        {
            check_body(body.len(), self.max_body)?;
            refuse_batch_delay(&properties)?;
            refuse_batch_half(self.header.sys_flag, &properties)?;
            targets.push(StoreTarget {
                topic: self.header.topic.clone(),
                queue_id: self.queue_id,
                flag,
                body,
                properties: merge_properties(self.properties, &properties),
                sys_flag: self.header.sys_flag,
                born_timestamp_ms: self.header.born_timestamp,
                born_host: self.born_host,
                reconsume_times: self.header.reconsume_times_or_zero(),
                prepared_transaction_offset: 0,
            });
        }
        Ok(targets)
    }

    /// A single message, dead-lettered past its retries, parked for its delay level, or
    /// kept as a half message until its transaction ends.
    fn single_target(&self, broker: &Broker, body: &Bytes) -> Result<StoreTarget, Refusal> {
        check_body(body.len(), self.max_body)?;
        if self.is_half() {
            return Ok(self.half_target(broker, body));
        }
        let properties = self.properties.to_string();
        let reconsume_times = self.header.reconsume_times_or_zero();
        let mut target_topic = self.header.topic.clone();
        let mut queue_id = self.queue_id;
        // A client that could not send back re-sends to %RETRY%: dead-letter it past the limit.
        if let Some(group) = self.header.topic.strip_prefix(RETRY_PREFIX) {
            let max = self
                .header
                .max_reconsume_times
                .unwrap_or_else(|| broker.groups().get_or_create(group).retry_max_times);
            if reconsume_times >= max {
                target_topic = format!("{DLQ_PREFIX}{group}");
                topic_for_send(broker, &target_topic)?;
                queue_id = 0;
            }
        }
        let target = StoreTarget {
            topic: target_topic,
            queue_id,
            flag: self.header.flag,
            body: body.clone(),
            properties,
            sys_flag: self.header.sys_flag,
            born_timestamp_ms: self.header.born_timestamp,
            born_host: self.born_host,
            reconsume_times,
            prepared_transaction_offset: 0,
        };
        Ok(park_if_delayed(broker, target, crate::now_ms())?)
    }
}

impl Sending<'_> {
    fn is_half(&self) -> bool {
        !self.header.is_batch() && is_half_message(self.header.sys_flag, self.properties)
    }

    fn half_target(&self, broker: &Broker, body: &Bytes) -> StoreTarget {
        let target = StoreTarget {
            topic: self.header.topic.clone(),
            queue_id: self.queue_id,
            flag: self.header.flag,
            body: body.clone(),
            properties: self.properties.to_owned(),
            sys_flag: self.header.sys_flag,
            born_timestamp_ms: self.header.born_timestamp,
            born_host: self.born_host,
            reconsume_times: self.header.reconsume_times_or_zero(),
            prepared_transaction_offset: 0,
        };
        half_message(broker, target, &self.header.producer_group)
    }
}

/// A batch member's properties, plus the header's for keys it does not set.
fn merge_properties(header: &str, own: &str) -> String {
    if header.is_empty() {
        return own.to_string();
    }
    let mut merged = parse_properties(header);
    merged.extend(parse_properties(own));
    encode_properties(merged.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}
