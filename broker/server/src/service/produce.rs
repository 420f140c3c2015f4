//! Appending messages: to the store (durable, and confirmed by a sync group's replicas), into
//! a topic that exists or is auto-created, parked for a delay level or a timer, or kept as a
//! transaction's half message.

use quiver_protocol::message as msg;
use quiver_store::record::{encode_properties, parse_properties, property, Record};
use quiver_store::{MessageStore, NewMessage, PutResult, StoreError};
use std::collections::BTreeMap;

use super::ServiceError;
use crate::broker::Broker;
use crate::schedule;
use crate::timer;
use crate::topics::{validate_topic_name, TopicConfig, DLQ_PREFIX, RETRY_PREFIX};
use crate::transaction;

pub(crate) use crate::target::StoreTarget;

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
            store_host: broker.store_host(),
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
            .metrics()
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
    let results = append_admitted(broker, targets, MessageStore::put_batch)?;
    record_in(broker, targets);
    Ok(results)
}

/// Stores the targets on the calling task and waits for durability holding no thread: an
/// append is a copy into mapped memory, so the request path skips the blocking pool. On a
/// group's master in sync mode it also waits until every in-sync replica holds them.
pub(crate) async fn store_message_async(
    broker: &Broker,
    targets: &[StoreTarget],
) -> Result<Vec<PutResult>, ServiceError> {
    let appended_batch = append_admitted(broker, targets, MessageStore::append)?;
    broker.wait_durable(appended_batch.end).await?;
    if let Some(replication) = &broker.replication() {
        replication.wait_confirmed(appended_batch.end).await?;
    }
    record_in(broker, targets);
    Ok(appended_batch.results)
}

/// Appends the targets with `append` once the write is admitted, then lets a group's
/// replication know the log grew.
fn append_admitted<R>(
    broker: &Broker,
    targets: &[StoreTarget],
    append: impl FnOnce(&MessageStore, &[NewMessage<'_>], i64) -> Result<R, StoreError>,
) -> Result<R, StoreError> {
    let appended_now = {
        let _admitted = admit_write(broker)?;
        append(
            broker.store(),
            &new_messages(broker, targets),
            crate::now_ms(),
        )?
    };
    appended(broker);
    Ok(appended_now)
}

/// On a group member, whether it may append now (the guard holds off a switchover until
/// the append is done); refused with the reason as the store's own refusals are.
fn admit_write(
    broker: &Broker,
) -> Result<Option<parking_lot::RwLockReadGuard<'_, ()>>, StoreError> {
    let Some(replication) = &broker.replication() else {
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
    if let Some(replication) = &broker.replication() {
        replication.appended(broker.store());
    }
}

/// The topic's config, created when auto-creation is on.
pub(crate) fn topic_for_send(broker: &Broker, topic: &str) -> Result<TopicConfig, ServiceError> {
    validate_topic_name(topic).map_err(|e| ServiceError::IllegalMessage(e.to_string()))?;
    if topic == crate::state_log::STATE_TOPIC {
        // Its records change consumer-group state: only the broker writes them.
        return Err(ServiceError::IllegalMessage(format!(
            "topic {topic} is the broker's internal state log: clients cannot send to it"
        )));
    }
    if let Some(config) = broker.topics().get(topic) {
        return Ok(config);
    }
    let system = topic.starts_with(RETRY_PREFIX) || topic.starts_with(DLQ_PREFIX);
    if !broker.config().auto_create_topics && !system {
        return Err(ServiceError::TopicNotFound(format!(
            "topic {topic} does not exist and auto-create-topics is off"
        )));
    }
    let queues = if system {
        1
    } else {
        broker.config().default_queue_nums
    };
    let (config, created) = broker.topics().get_or_create(topic, queues);
    if created {
        tracing::info!(topic, queues, "topic auto-created");
    }
    Ok(config)
}

/// Makes sure a topic that a scheduled or retried message goes to exists.
pub(crate) fn ensure_topic(broker: &Broker, topic: &str) {
    if let Err(error) = topic_for_send(broker, topic) {
        tracing::warn!(topic, remark = %error, "cannot create topic for a scheduled message");
    }
}

pub(crate) fn check_broker_writable(broker: &Broker) -> Result<(), ServiceError> {
    if broker.is_writable() {
        return Ok(());
    }
    Err(ServiceError::Forbidden(format!(
        "broker {} is not writable (brokerPermission {})",
        broker.config().broker_name,
        broker.permission()
    )))
}

/// A message with a delay level parked in the schedule topic, or with a timer property due
/// later parked in the timer topic (as Apache's `HookUtils.handleScheduleMessage`: a delay
/// level wins); due already or neither, it goes to its topic as is. A timer beyond
/// `timer-max-delay-ms` or malformed is refused.
pub(crate) fn park_if_delayed(
    broker: &Broker,
    mut target: StoreTarget,
    now: i64,
) -> Result<StoreTarget, ServiceError> {
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
        ServiceError::IllegalMessage(format!("{reason}; the message was not stored"))
    })?;
    let Some(deliver_ms) = deliver_ms.filter(|at| *at > now) else {
        return Ok(target);
    };
    let max = broker.config().timer_max_delay_ms;
    if deliver_ms - now > i64::try_from(max).unwrap_or(i64::MAX) {
        return Err(ServiceError::IllegalMessage(format!(
            "timed delivery {} ms ahead exceeds timer-max-delay-ms {max}; the message was \
             not stored",
            deliver_ms - now
        )));
    }
    broker.topics().get_or_create(timer::TIMER_TOPIC, 1);
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
    broker.topics().get_or_create(transaction::HALF_TOPIC, 1);
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
pub(crate) fn is_half_message(sys_flag: i32, properties: &str) -> bool {
    msg::sys_flag::transaction_type(sys_flag) == msg::sys_flag::TRANSACTION_PREPARED
        || property(properties, msg::PROPERTY_TRANSACTION_PREPARED) == Some("true")
}

/// As Apache's producers: a batch cannot carry half messages (each needs its own outcome).
pub(crate) fn refuse_batch_half(sys_flag: i32, properties: &str) -> Result<(), ServiceError> {
    if is_half_message(sys_flag, properties) {
        return Err(ServiceError::IllegalMessage(
            "a batch cannot carry transactional (half) messages; send them one by one; the \
             batch was not stored"
                .into(),
        ));
    }
    Ok(())
}

/// As Apache (`CommitLog.asyncPutMessages`): a delay level or a timer, on the batch or on
/// one of its messages, is refused, never stored as an immediate message.
pub(crate) fn refuse_batch_delay(properties: &str) -> Result<(), ServiceError> {
    if property(properties, msg::PROPERTY_DELAY).is_some_and(|level| level.trim() != "0") {
        return Err(ServiceError::IllegalMessage(
            "a batch cannot carry a delay level (DELAY); send delayed messages one by one; \
             the batch was not stored"
                .into(),
        ));
    }
    for timer in [
        msg::PROPERTY_TIMER_DELIVER_MS,
        msg::PROPERTY_TIMER_DELAY_SEC,
        msg::PROPERTY_TIMER_DELAY_MS,
    ] {
        if property(properties, timer).is_some() {
            return Err(ServiceError::IllegalMessage(format!(
                "a batch cannot carry a timer ({timer}); send timed messages one by one; \
                 the batch was not stored"
            )));
        }
    }
    Ok(())
}

/// A body neither empty nor over `max-message-size`.
pub(crate) fn check_body(len: usize, max: usize) -> Result<(), ServiceError> {
    if len == 0 {
        return Err(ServiceError::IllegalMessage("message body is empty".into()));
    }
    if len > max {
        return Err(ServiceError::BodyTooLarge(format!(
            "message body of {len} bytes exceeds max-message-size {max}"
        )));
    }
    Ok(())
}

/// The record's properties for its next delivery: where it came from (RETRY_TOPIC, kept from
/// the first failure) and its origin message id; any delay level is the retry's, not its own.
pub(crate) fn retry_properties(
    record: &Record,
    origin_msg_id: Option<String>,
) -> BTreeMap<String, String> {
    let mut properties = record.properties_map();
    if property(&record.properties, msg::PROPERTY_RETRY_TOPIC).is_none() {
        properties.insert(msg::PROPERTY_RETRY_TOPIC.into(), record.topic.clone());
    }
    let origin = origin_msg_id
        .or_else(|| {
            property(&record.properties, msg::PROPERTY_ORIGIN_MESSAGE_ID).map(str::to_string)
        })
        .unwrap_or_else(|| msg::offset_msg_id(record.store_host, record.physical_offset.0));
    properties.insert(msg::PROPERTY_ORIGIN_MESSAGE_ID.into(), origin);
    properties.remove(msg::PROPERTY_DELAY);
    properties
}
