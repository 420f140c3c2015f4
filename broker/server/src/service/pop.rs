//! POP consumption over the broker (receive, ack, change invisible, forward to the dead
//! letter queue): the methods of [`PopService`] that read the store and write retries, kept
//! apart from its state (`crate::pop`) so the broker can hold that state.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quiver_store::record::{decode, encode_properties, queue_offset_and_reconsume_times_of};
use quiver_store::{
    Delivery, GetFilter, GetStatus, PopKey, PopStateError, QueueOffset, ReadStart, StoreError,
};

use super::produce::{ensure_topic, retry_properties, store_message, StoreTarget};
use crate::broker::Broker;
use crate::error::chain;
use crate::filter::{record_matches, ConsumerFilter};
use crate::pop::*;
use crate::topics::{DLQ_PREFIX, RETRY_PREFIX};

/// Most bytes one queue read returns (at least one message).
const MAX_BYTES_PER_READ: u64 = 4 * 1024 * 1024;
/// One receive in this many reads the retry queues before the topic's own.
const RETRY_FIRST_EVERY: usize = 5;
/// How long a message being moved stays invisible: a crash mid-move revives it after this.
const MOVE_LEASE_MS: i64 = 30_000;

/// A receive's settings, owned (so it can run on a blocking thread).
struct Spec {
    group: String,
    topic: String,
    filter: ConsumerFilter,
    max_messages: usize,
    invisible_ms: i64,
}

/// A batched ack's handles of one queue: their places in the request and (offset, revision).
type QueueAcks = (Vec<usize>, Vec<(u64, u64)>);

/// What one receive pass reads: a queue of the topic or of its retry topic.
struct Source {
    topic: String,
    queue_id: u32,
    retry: bool,
}

impl PopService {
    /// Receives up to `max_messages`, long polling up to `long_poll` when there are none.
    pub async fn receive(
        &self,
        broker: &Arc<Broker>,
        req: ReceiveRequest<'_>,
    ) -> Result<Vec<Popped>, PopError> {
        let spec = Arc::new(Spec {
            group: req.group.to_owned(),
            topic: req.topic.to_owned(),
            filter: req.filter.clone(),
            max_messages: req.max_messages.clamp(1, MAX_MESSAGES_PER_RECEIVE),
            invisible_ms: i64::try_from(req.invisible.as_millis()).unwrap_or(i64::MAX / 4),
        });
        let deadline = Instant::now() + req.long_poll;
        // Registered before the first read, so a message stored in between wakes the wait.
        let watch = (!req.long_poll.is_zero()).then(|| {
            let retry = retry_topic(req.group, req.topic);
            self.wakers.watch(vec![req.topic.to_owned(), retry])
        });
        loop {
            let popped = self.receive_once(broker, &spec).await?;
            let Some(watch) = &watch else {
                return Ok(popped);
            };
            if !popped.is_empty() || Instant::now() >= deadline {
                return Ok(popped);
            }
            let woken = {
                let _parked = watch.parked();
                tokio::time::timeout_at(deadline.into(), watch.notify.notified()).await
            };
            if woken.is_err() {
                // One last look: an in-order queue may have become visible again just now.
                return self.receive_once(broker, &spec).await;
            }
        }
    }

    /// One pass over the queues: on this task in async flush mode, else on a blocking thread
    /// (the state's records are fsynced before the messages are handed out).
    async fn receive_once(
        &self,
        broker: &Arc<Broker>,
        spec: &Arc<Spec>,
    ) -> Result<Vec<Popped>, PopError> {
        if broker.config().flush_mode == crate::config::FlushMode::Async {
            return self.receive_now(broker, spec, crate::now_ms());
        }
        let spec = spec.clone();
        crate::broker::blocking(broker, move |broker| {
            broker.pop().receive_now(broker, &spec, crate::now_ms())
        })
        .await
        .map_err(PopError::Task)?
    }

    /// Reads the topic's queues and its retry topic's, round robin, until `max_messages`.
    fn receive_now(
        &self,
        broker: &Broker,
        spec: &Spec,
        now_ms: i64,
    ) -> Result<Vec<Popped>, PopError> {
        let topic = broker
            .topics()
            .get(&spec.topic)
            .ok_or_else(|| PopError::TopicNotFound(spec.topic.clone()))?;
        let group = broker.groups().get_or_create(&spec.group);
        if !group.consume_enable {
            return Err(PopError::ConsumeDisabled(spec.group.clone()));
        }
        let mut sources: Vec<Source> = (0..topic.read_queue_nums)
            .map(|queue_id| Source {
                topic: spec.topic.clone(),
                queue_id,
                retry: false,
            })
            .collect();
        let retry = retry_topic(&spec.group, &spec.topic);
        let retry_queues = broker.topics().get(&retry).map_or(0, |t| t.read_queue_nums);
        let turn = self.receives.fetch_add(1, Ordering::Relaxed);
        let start = turn % sources.len().max(1);
        sources.rotate_left(start);
        let retries = (0..retry_queues).map(|queue_id| Source {
            topic: retry.clone(),
            queue_id,
            retry: true,
        });
        if turn % RETRY_FIRST_EVERY == 0 {
            sources.splice(0..0, retries);
        } else {
            sources.extend(retries);
        }
        let mut popped = Vec::new();
        for source in &sources {
            if popped.len() >= spec.max_messages {
                break;
            }
            let fifo = group.consume_message_orderly;
            self.receive_queue(broker, spec, source, fifo, now_ms, &mut popped)?;
        }
        Ok(popped)
    }

    /// Receives from one queue into `popped`.
    fn receive_queue(
        &self,
        broker: &Broker,
        spec: &Spec,
        source: &Source,
        fifo: bool,
        now_ms: i64,
        popped: &mut Vec<Popped>,
    ) -> Result<(), PopError> {
        let key = PopKey::new(&spec.group, &source.topic, source.queue_id);
        let until = now_ms.saturating_add(spec.invisible_ms);
        let room = spec.max_messages - popped.len();
        let initial = || initial_offset(broker, &key);
        match self
            .state
            .begin_read(&key, fifo, now_ms, until, room, initial)?
        {
            ReadStart::Busy | ReadStart::Blocked => Ok(()),
            ReadStart::Redeliver(deliveries) => {
                self.count_revived(RevivedTo::InPlace, deliveries.len() as u64);
                for delivery in deliveries {
                    match read_one(broker, &key, delivery.offset) {
                        Some(record) => popped.push(self.popped(spec, source, record, delivery)),
                        // Retention deleted it: nothing left to deliver.
                        None => self.drop_gone(broker, &key, delivery)?,
                    }
                }
                Ok(())
            }
            ReadStart::Read(claim) => {
                let (next, records) = read_queue(broker, &key, claim.from(), room, &spec.filter)?;
                let received: Vec<(u64, u32)> = records
                    .iter()
                    .map(|(offset, attempt, _)| (*offset, *attempt))
                    .collect();
                let deliveries = claim.finish(next, &received, until)?;
                for ((_, _, record), delivery) in records.into_iter().zip(deliveries) {
                    popped.push(self.popped(spec, source, record, delivery));
                }
                self.commit_prefix(broker, &key);
                Ok(())
            }
        }
    }

    fn popped(&self, spec: &Spec, source: &Source, record: Bytes, delivery: Delivery) -> Popped {
        let handle = Handle {
            retry: source.retry,
            queue_id: source.queue_id,
            offset: delivery.offset,
            revision: delivery.entry.revision,
        };
        Popped {
            record,
            topic: spec.topic.clone(),
            queue_id: source.queue_id,
            queue_offset: delivery.offset,
            receipt_handle: handle.encode(),
            delivery_attempt: delivery.entry.attempt,
            invisible_until_ms: delivery.entry.invisible_until_ms,
        }
    }

    fn drop_gone(&self, broker: &Broker, key: &PopKey, delivery: Delivery) -> Result<(), PopError> {
        tracing::warn!(group = %key.group, topic = %key.topic, queue = key.queue_id, offset = delivery.offset, "in-flight message no longer stored: dropped");
        match self
            .state
            .remove(key, delivery.offset, delivery.entry.revision)
        {
            Ok(_) | Err(PopStateError::NotInFlight { .. } | PopStateError::Superseded { .. }) => {
                self.commit_prefix(broker, key);
                Ok(())
            }
            Err(PopStateError::Store(error)) => Err(error.into()),
        }
    }

    /// Acks one received message. Blocking in sync flush mode (fsync).
    pub fn ack(
        &self,
        broker: &Broker,
        group: &str,
        topic: &str,
        handle: &str,
    ) -> Result<(), PopError> {
        let handle = Handle::parse(handle).ok_or(PopError::InvalidHandle)?;
        let key = handle.key(group, topic);
        let removed = self.state.remove(&key, handle.offset, handle.revision)?;
        self.after_remove(broker, &key, removed);
        Ok(())
    }

    /// Acks several received messages (an AckMessage with many entries) in one pass per
    /// queue: one lock, one log append and one prefix commit for all of a queue's handles,
    /// where [`PopService::ack`] per handle would take each once. Each handle's result, in
    /// order; a handle this broker did not issue fails alone. Blocking in sync flush mode.
    pub fn ack_all(
        &self,
        broker: &Broker,
        group: &str,
        topic: &str,
        handles: &[String],
    ) -> Vec<Result<(), PopError>> {
        let mut results: Vec<Result<(), PopError>> = Vec::with_capacity(handles.len());
        let mut queues: BTreeMap<PopKey, QueueAcks> = BTreeMap::new();
        for (at, text) in handles.iter().enumerate() {
            let Some(handle) = Handle::parse(text) else {
                results.push(Err(PopError::InvalidHandle));
                continue;
            };
            let (places, entries) = queues.entry(handle.key(group, topic)).or_default();
            places.push(at);
            entries.push((handle.offset, handle.revision));
            results.push(Ok(()));
        }
        for (key, (places, entries)) in queues {
            match self.state.remove_many(&key, &entries) {
                Ok((removed, moved)) => {
                    let any = removed.iter().any(Result::is_ok);
                    for (at, result) in places.into_iter().zip(removed) {
                        results[at] = result.map_err(PopError::from);
                    }
                    if any {
                        self.after_remove(broker, &key, moved);
                    }
                }
                Err(error) => {
                    let failed = chain(&error);
                    for at in places {
                        // Every entry of the queue failed with the one append.
                        results[at] = Err(PopError::Store(StoreError::Io {
                            op: "ack",
                            path: key.topic.clone().into(),
                            source: std::io::Error::other(failed.clone()),
                        }));
                    }
                }
            }
        }
        results
    }

    /// Commits a moved prefix; an emptied queue may unblock an in-order receive.
    fn after_remove(&self, broker: &Broker, key: &PopKey, (before, after): (u64, u64)) {
        if before != after {
            self.commit_prefix(broker, key);
        }
        if self.state.inflight_count(key) == 0 {
            self.wakers.wake(&key.topic);
        }
    }

    /// Makes a received message invisible for `invisible` from now; returns the new receipt
    /// handle (the old one stops working). Blocking in sync flush mode.
    pub fn change_invisible(
        &self,
        _broker: &Broker,
        group: &str,
        topic: &str,
        handle: &str,
        invisible: Duration,
    ) -> Result<String, PopError> {
        let parsed = Handle::parse(handle).ok_or(PopError::InvalidHandle)?;
        let key = parsed.key(group, topic);
        let invisible_ms = i64::try_from(invisible.as_millis()).unwrap_or(i64::MAX / 4);
        let until = crate::now_ms().saturating_add(invisible_ms);
        let renewed = self
            .state
            .renew(&key, parsed.offset, parsed.revision, until)?;
        Ok(Handle {
            revision: renewed.revision,
            ..parsed
        }
        .encode())
    }

    /// Moves a received message to `%DLQ%<group>` now. Blocking (stores the copy).
    pub fn forward_to_dead_letter(
        &self,
        broker: &Broker,
        group: &str,
        topic: &str,
        handle: &str,
    ) -> Result<(), PopError> {
        let parsed = Handle::parse(handle).ok_or(PopError::InvalidHandle)?;
        let key = parsed.key(group, topic);
        let delivery = Delivery {
            offset: parsed.offset,
            entry: self
                .state
                .inflight(&key, parsed.offset)
                .filter(|entry| entry.revision == parsed.revision)
                .ok_or(PopError::HandleExpired)?,
        };
        move_message(self, broker, &key, delivery, Destination::DeadLetter)
    }

    /// Commits `key`'s acked prefix as the group's consumer offset (GET_CONSUME_STATS lag).
    fn commit_prefix(&self, broker: &Broker, key: &PopKey) {
        if let Some(prefix) = self.state.acked_prefix(key) {
            let offset = QueueOffset(prefix);
            super::consume::commit_offset(broker, &key.group, &key.topic, key.queue_id, offset);
        }
    }
}

/// Where a queue never read by the group starts: its committed offset, else the oldest
/// message still stored.
fn initial_offset(broker: &Broker, key: &PopKey) -> u64 {
    broker
        .offsets()
        .query(&key.group, &key.topic, key.queue_id)
        .unwrap_or_else(|| broker.store().min_offset(&key.topic, key.queue_id))
        .0
}

/// The stored record at `offset` of `key`'s queue, if still there.
fn read_one(broker: &Broker, key: &PopKey, offset: u64) -> Option<Bytes> {
    let got = broker
        .store()
        .get(
            &key.topic,
            key.queue_id,
            QueueOffset(offset),
            1,
            MAX_BYTES_PER_READ,
            &|_| true,
        )
        .ok()?;
    let record = got.messages.into_iter().next()?;
    let (stored_at, _) = queue_offset_and_reconsume_times_of(&record)?;
    (stored_at.0 == offset).then_some(record)
}

/// A queue read: the offset reached and (offset, attempt, record) of each message the filter
/// let through.
type QueueRead = (u64, Vec<(u64, u32, Bytes)>);

/// Reads up to `room` messages from `from`; below the queue's first offset (retention
/// deleted files) it starts from that.
fn read_queue(
    broker: &Broker,
    key: &PopKey,
    from: u64,
    room: usize,
    filter: &ConsumerFilter,
) -> Result<QueueRead, StoreError> {
    let tags = |code: i64| filter.accepts_tags_code(code);
    let property = |record: &[u8]| filter.selector().is_none_or(|s| record_matches(s, record));
    let get_filter = GetFilter {
        tags_code: &tags,
        record: filter
            .selector()
            .map(|_| &property as &dyn Fn(&[u8]) -> bool),
    };
    let max = u32::try_from(room).unwrap_or(u32::MAX);
    let mut got = broker.store().get_filtered(
        &key.topic,
        key.queue_id,
        QueueOffset(from),
        max,
        MAX_BYTES_PER_READ,
        &get_filter,
    )?;
    if got.status == GetStatus::OffsetTooSmall {
        let first = got.next_begin_offset;
        got = broker.store().get_filtered(
            &key.topic,
            key.queue_id,
            first,
            max,
            MAX_BYTES_PER_READ,
            &get_filter,
        )?;
    }
    let next = match got.status {
        GetStatus::Found | GetStatus::NoMatchedMessage => got.next_begin_offset.0,
        _ => from,
    };
    let records = got
        .messages
        .into_iter()
        .filter_map(|record| {
            // The store hands out whole records only: the fields are there.
            let (offset, reconsume_times) = queue_offset_and_reconsume_times_of(&record)?;
            let attempt = u32::try_from(reconsume_times).unwrap_or(0) + 1;
            Some((offset.0, attempt, record))
        })
        .collect();
    Ok((next, records))
}

/// Where a revived message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Destination {
    Retry,
    DeadLetter,
}

/// Stores a copy of an in-flight message at `destination` and takes it out of flight. The
/// message is leased first (its handle stops working), so an ack cannot race the copy; a
/// crash between the copy and the removal revives it again (at least once).
pub(crate) fn move_message(
    pop: &PopService,
    broker: &Broker,
    key: &PopKey,
    delivery: Delivery,
    destination: Destination,
) -> Result<(), PopError> {
    let lease_until = crate::now_ms().saturating_add(MOVE_LEASE_MS);
    let leased = pop
        .state
        .renew(key, delivery.offset, delivery.entry.revision, lease_until)?;
    let leased = Delivery {
        offset: delivery.offset,
        entry: leased,
    };
    let Some(stored) = read_one(broker, key, delivery.offset) else {
        return pop.drop_gone(broker, key, leased);
    };
    let record = match decode(&stored) {
        Ok((record, _)) => record,
        // Undeliverable by any path: dropped (loudly) rather than stalling every later round.
        Err(source) => {
            let error = PopError::BadRecord {
                topic: key.topic.clone(),
                queue_id: key.queue_id,
                offset: delivery.offset,
                source,
            };
            tracing::error!(group = %key.group, error = %chain(&error), "in-flight message cannot be decoded");
            return pop.drop_gone(broker, key, leased);
        }
    };
    let topic = match destination {
        Destination::DeadLetter => format!("{DLQ_PREFIX}{}", key.group),
        Destination::Retry if key.topic.starts_with(RETRY_PREFIX) => key.topic.clone(),
        Destination::Retry => retry_topic(&key.group, &key.topic),
    };
    ensure_topic(broker, &topic);
    let queues = broker
        .topics()
        .get(&topic)
        .map_or(1, |t| t.write_queue_nums.max(1));
    let properties = retry_properties(&record, None);
    let queue_id = u32::try_from(delivery.offset % u64::from(queues)).unwrap_or(0);
    let properties = encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let target = StoreTarget {
        reconsume_times: record.reconsume_times + 1,
        ..StoreTarget::copy_of(&record, topic, queue_id, properties)
    };
    store_message(broker, &[target])?;
    let removed = pop
        .state
        .remove(key, leased.offset, leased.entry.revision)?;
    pop.after_remove(broker, key, removed);
    let to = match destination {
        Destination::Retry => RevivedTo::Retry,
        Destination::DeadLetter => RevivedTo::DeadLetter,
    };
    pop.count_revived(to, 1);
    tracing::debug!(group = %key.group, topic = %key.topic, queue = key.queue_id, offset = delivery.offset, to = to.label(), "POP message revived");
    Ok(())
}
