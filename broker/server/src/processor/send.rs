//! SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320).

use std::net::SocketAddr;

use bytes::Bytes;
use quiver_protocol::code::response;
use quiver_protocol::header::{SendMessageRequestHeader, SendMessageResponseHeader};
use quiver_protocol::message::{self as msg, BatchMessage};
use quiver_protocol::RemotingCommand;
use quiver_store::record::{encode_properties, parse_properties, property};
use quiver_store::{NewMessage, PutResult, StoreError};

use super::{Ctx, Outcome, Refusal};
use crate::broker::Broker;
use crate::schedule;
use crate::timer;
use crate::topics::{validate_topic_name, TopicConfig, DLQ_PREFIX, RETRY_PREFIX};
use crate::transaction;

/// One message to append, owned so it can cross into a blocking task.
#[derive(Clone, Debug)]
pub(crate) struct StoreTarget {
    pub topic: String,
    pub queue_id: u32,
    pub flag: i32,
    pub body: Bytes,
    pub properties: String,
    pub sys_flag: i32,
    pub born_timestamp_ms: i64,
    pub born_host: SocketAddr,
    pub reconsume_times: i32,
    /// A committed transactional message: where its half message is in the CommitLog.
    pub prepared_transaction_offset: i64,
}

fn new_messages<'a>(broker: &Broker, targets: &'a [StoreTarget]) -> Vec<NewMessage<'a>> {
    targets
        .iter()
        .map(|t| NewMessage {
            topic: &t.topic,
            queue_id: t.queue_id,
            flag: t.flag,
            body: &t.body,
            properties: &t.properties,
            sys_flag: t.sys_flag,
            born_timestamp_ms: t.born_timestamp_ms,
            born_host: t.born_host,
            store_host: broker.store_host,
            reconsume_times: t.reconsume_times,
            prepared_transaction_offset: t.prepared_transaction_offset,
        })
        .collect()
}

/// Counts the stored messages per topic: one metrics update per run of the same topic (a
/// batch's messages share theirs), not one per message.
fn record_in(broker: &Broker, targets: &[StoreTarget]) {
    for run in targets.chunk_by(|a, b| a.topic == b.topic) {
        let bytes = run.iter().map(|target| target.body.len() as u64).sum();
        broker
            .metrics
            .record_in(&run[0].topic, run.len() as u64, bytes);
    }
}

/// Stores the targets, blocking until they are durable: for callers on a blocking thread
/// (deliveries of delayed, timed, retried and transactional messages). On a group's master
/// they are not waited for on the replicas: their source stays until they are confirmed
/// readable, and a failover redelivers rather than skips.
pub(crate) fn store_message(
    broker: &Broker,
    targets: &[StoreTarget],
) -> Result<Vec<PutResult>, StoreError> {
    let results = {
        let _admitted = admit_write(broker)?;
        broker
            .store
            .put_batch(&new_messages(broker, targets), crate::now_ms())?
    };
    appended(broker);
    record_in(broker, targets);
    Ok(results)
}

/// Stores the targets on the calling task and waits for durability holding no thread: an
/// append is a copy into mapped memory, so the request path skips the blocking pool. On a
/// group's master in sync mode it also waits until every in-sync replica holds them.
pub(crate) async fn store_message_async(
    broker: &Broker,
    targets: &[StoreTarget],
) -> Result<Vec<PutResult>, SendError> {
    let appended_batch = {
        let _admitted = admit_write(broker)?;
        broker
            .store
            .append(&new_messages(broker, targets), crate::now_ms())?
    };
    appended(broker);
    broker.wait_durable(appended_batch.end).await?;
    if let Some(replication) = &broker.replication {
        replication.wait_confirmed(appended_batch.end).await?;
    }
    record_in(broker, targets);
    Ok(appended_batch.results)
}

/// On a group member, whether it may append now (the guard holds off a switchover until
/// the append is done); refused with the reason as the store's own refusals are.
fn admit_write(
    broker: &Broker,
) -> Result<Option<parking_lot::RwLockReadGuard<'_, ()>>, StoreError> {
    let Some(replication) = &broker.replication else {
        return Ok(None);
    };
    replication.admit_write().map(Some).map_err(|refusal| {
        StoreError::WritesRefused(quiver_store::WriteRefusal {
            reason: quiver_store::RefusalReason::NotMaster,
            message: refusal.to_string(),
        })
    })
}

fn appended(broker: &Broker) {
    if let Some(replication) = &broker.replication {
        replication.appended(&broker.store);
    }
}

/// Why a send was not acknowledged.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Replication(#[from] crate::replication::ConfirmError),
}

impl From<SendError> for Refusal {
    fn from(error: SendError) -> Refusal {
        match error {
            SendError::Store(error) => Refusal::from(error),
            // Apache's answers when the slaves do not hold the message: none stored it.
            SendError::Replication(
                error @ crate::replication::ConfirmError::TooFewCopies { .. },
            ) => Refusal::new(response::SLAVE_NOT_AVAILABLE, error.to_string()),
            SendError::Replication(error) => {
                Refusal::new(response::FLUSH_SLAVE_TIMEOUT, error.to_string())
            }
        }
    }
}

/// The topic's config, created when auto-creation is on.
pub(crate) fn topic_for_send(broker: &Broker, topic: &str) -> Result<TopicConfig, Refusal> {
    validate_topic_name(topic)
        .map_err(|e| Refusal::new(response::MESSAGE_ILLEGAL, e.to_string()))?;
    if let Some(config) = broker.topics.get(topic) {
        return Ok(config);
    }
    let system = topic.starts_with(RETRY_PREFIX) || topic.starts_with(DLQ_PREFIX);
    if !broker.config.auto_create_topics && !system {
        return Err(Refusal::new(
            response::TOPIC_NOT_EXIST,
            format!("topic {topic} does not exist and auto-create-topics is off"),
        ));
    }
    let queues = if system {
        1
    } else {
        broker.config.default_queue_nums
    };
    let (config, created) = broker.topics.get_or_create(topic, queues);
    if created {
        tracing::info!(topic, queues, "topic auto-created");
    }
    Ok(config)
}

pub async fn handle(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let header = SendMessageRequestHeader::from_request(req)?;
    let properties_text = header.properties.clone().unwrap_or_default();
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
        max_body: broker.config.max_message_size as usize,
    };
    let targets = if header.is_batch() {
        sending.batch_targets(&req.body)?
    } else {
        vec![sending.single_target(broker, &req.body)?]
    };
    let results = store_message_async(broker, &targets).await?;
    let ids: Vec<String> = results
        .iter()
        .map(|r| msg::offset_msg_id(broker.store_host, r.physical_offset.0))
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

pub(crate) fn check_broker_writable(broker: &Broker) -> Result<(), Refusal> {
    if broker.is_writable() {
        return Ok(());
    }
    Err(Refusal::new(
        response::NO_PERMISSION,
        format!(
            "broker {} is not writable (brokerPermission {})",
            broker.config.broker_name,
            broker.permission()
        ),
    ))
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
                .unwrap_or_else(|| broker.groups.get_or_create(group).retry_max_times);
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
        park_if_delayed(broker, target, crate::now_ms())
    }
}

/// A message with a delay level parked in the schedule topic, or with a timer property due
/// later parked in the timer topic (as Apache's `HookUtils.handleScheduleMessage`: a delay
/// level wins); due already or neither, it goes to its topic as is. A timer beyond
/// `timer-max-delay-ms` or malformed is refused.
pub(crate) fn park_if_delayed(
    broker: &Broker,
    mut target: StoreTarget,
    now: i64,
) -> Result<StoreTarget, Refusal> {
    if let Some(level) = property(&target.properties, msg::PROPERTY_DELAY)
        .and_then(|level| level.parse::<usize>().ok())
        .filter(|level| *level > 0)
    {
        let level = level.min(schedule::DELAY_LEVELS_MS.len());
        target.properties =
            schedule::delay_properties(&target.properties, &target.topic, target.queue_id, level);
        target.topic = crate::topics::SCHEDULE_TOPIC.to_string();
        target.queue_id = schedule::queue_of_level(level);
        return Ok(target);
    }
    let deliver_ms = timer::deliver_ms(&target.properties, now).map_err(|reason| {
        Refusal::new(
            response::MESSAGE_ILLEGAL,
            format!("{reason}; the message was not stored"),
        )
    })?;
    let Some(deliver_ms) = deliver_ms.filter(|at| *at > now) else {
        return Ok(target);
    };
    let max = broker.config.timer_max_delay_ms;
    if deliver_ms - now > i64::try_from(max).unwrap_or(i64::MAX) {
        return Err(Refusal::new(
            response::MESSAGE_ILLEGAL,
            format!(
                "timed delivery {} ms ahead exceeds timer-max-delay-ms {max}; the message was \
                 not stored",
                deliver_ms - now
            ),
        ));
    }
    broker.topics.get_or_create(timer::TIMER_TOPIC, 1);
    target.properties = timer::timer_properties(
        &target.properties,
        &target.topic,
        target.queue_id,
        deliver_ms,
    );
    target.topic = timer::TIMER_TOPIC.to_string();
    target.queue_id = timer::TIMER_QUEUE;
    Ok(target)
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

/// The half message of `target` in the half topic's queue 0, remembering its real topic and
/// queue and its producer group, with the transaction bits of its sysFlag cleared (as
/// Apache's `TransactionalMessageBridge.parseHalfMessageInner`).
pub(crate) fn half_message(
    broker: &Broker,
    target: StoreTarget,
    producer_group: &str,
) -> StoreTarget {
    let mut properties = parse_properties(&target.properties);
    properties.insert(msg::PROPERTY_REAL_TOPIC.into(), target.topic.clone());
    properties.insert(msg::PROPERTY_REAL_QID.into(), target.queue_id.to_string());
    properties
        .entry(msg::PROPERTY_PRODUCER_GROUP.into())
        .or_insert_with(|| producer_group.to_owned());
    broker.topics.get_or_create(transaction::HALF_TOPIC, 1);
    StoreTarget {
        topic: transaction::HALF_TOPIC.to_owned(),
        queue_id: transaction::HALF_QUEUE,
        properties: encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        sys_flag: msg::sys_flag::with_transaction_type(
            target.sys_flag,
            msg::sys_flag::TRANSACTION_NOT_TYPE,
        ),
        ..target
    }
}

/// A transactional half message: sysFlag TRANSACTION_PREPARED or property TRAN_MSG=true.
fn is_half_message(sys_flag: i32, properties: &str) -> bool {
    msg::sys_flag::transaction_type(sys_flag) == msg::sys_flag::TRANSACTION_PREPARED
        || property(properties, msg::PROPERTY_TRANSACTION_PREPARED) == Some("true")
}

/// As Apache's producers: a batch cannot carry half messages (each needs its own outcome).
fn refuse_batch_half(sys_flag: i32, properties: &str) -> Result<(), Refusal> {
    if is_half_message(sys_flag, properties) {
        return Err(Refusal::new(
            response::MESSAGE_ILLEGAL,
            "a batch cannot carry transactional (half) messages; send them one by one; the \
             batch was not stored",
        ));
    }
    Ok(())
}

/// As Apache (`CommitLog.asyncPutMessages`): a delay level or a timer, on the batch or on
/// one of its messages, is MESSAGE_ILLEGAL, never stored as an immediate message.
fn refuse_batch_delay(properties: &str) -> Result<(), Refusal> {
    if property(properties, msg::PROPERTY_DELAY).is_some_and(|level| level.trim() != "0") {
        return Err(Refusal::new(
            response::MESSAGE_ILLEGAL,
            "a batch cannot carry a delay level (DELAY); send delayed messages one by one; \
             the batch was not stored",
        ));
    }
    for timer in [
        msg::PROPERTY_TIMER_DELIVER_MS,
        msg::PROPERTY_TIMER_DELAY_SEC,
        msg::PROPERTY_TIMER_DELAY_MS,
    ] {
        if property(properties, timer).is_some() {
            return Err(Refusal::new(
                response::MESSAGE_ILLEGAL,
                format!(
                    "a batch cannot carry a timer ({timer}); send timed messages one by one; \
                     the batch was not stored"
                ),
            ));
        }
    }
    Ok(())
}

fn check_body(len: usize, max: usize) -> Result<(), Refusal> {
    if len == 0 {
        return Err(Refusal::new(
            response::MESSAGE_ILLEGAL,
            "message body is empty",
        ));
    }
    if len > max {
        return Err(Refusal::new(
            response::MESSAGE_ILLEGAL,
            format!("message body of {len} bytes exceeds max-message-size {max}"),
        ));
    }
    Ok(())
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
