//! The transaction check-back: every `transaction-check-interval-ms` on the master, half
//! messages without an op record are asked about (CHECK_TRANSACTION_STATE to a producer of
//! their group, over remoting or a 5.x client's Telemetry stream), re-put with their check
//! count, and discarded to `CHECK_MAX_TIME_TOPIC` past the limit (see `crate::transaction`).

use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use quiver_protocol::header::CheckTransactionStateRequestHeader;
use quiver_protocol::message as msg;
use quiver_protocol::record::{self, decode, encode_properties, Placement, Record};
use quiver_protocol::{code, RemotingCommand};
use quiver_remoting::ConnectionError;
use quiver_store::QueueOffset;

use crate::broker::{blocking, Broker};
use crate::error::{chain, BrokerError};
use crate::service::produce::{store_message, StoreTarget};
use crate::service::transaction::op_target;
use crate::transaction::*;

/// How long a check may wait for room in a producer connection's outbound queue.
const CHECK_SEND_TIMEOUT: Duration = Duration::from_secs(3);

/// The same half message in `topic`'s queue 0, with `properties`.
fn copy_of(half: &Record, topic: &str, properties: String) -> StoreTarget {
    StoreTarget::copy_of(half, topic.to_owned(), HALF_QUEUE, properties)
}

/// A CHECK_TRANSACTION_STATE to send to a producer group.
struct CheckBack {
    group: String,
    request: RemotingCommand,
}

/// One round of the check-back loop (on the master only: it checks back and writes the
/// outcomes); a full disk refuses every re-put: half messages wait in place until there is
/// room.
pub async fn check_back_round(broker: Arc<Broker>) -> ControlFlow<(), Option<String>> {
    match blocking(&broker, |broker| check_round(broker, crate::now_ms())).await {
        Ok((checks, error)) => {
            send_checks(&broker, checks).await;
            ControlFlow::Continue(error.map(|e| chain(&e)))
        }
        Err(error) => {
            tracing::error!(error = %chain(&error), "transaction check task failed");
            ControlFlow::Break(())
        }
    }
}

/// Sends each check to a 5.x producer through the gRPC port's sessions when one takes it
/// (`GrpcState::check_back`), else over a live connection of its producer group (the newest
/// heartbeat).
async fn send_checks(broker: &Broker, checks: Vec<CheckBack>) {
    for check in checks {
        if broker.grpc().check_back(&check.group, &check.request) {
            broker
                .transactions()
                .checks_sent
                .fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let producer = broker
            .producers()
            .clients(&check.group)
            .into_iter()
            .filter(|client| !client.connection.remoting.is_closed())
            .max_by_key(|client| client.last_heartbeat_ms);
        let Some(producer) = producer else {
            broker
                .transactions()
                .checks_unsent
                .fetch_add(1, Ordering::Relaxed);
            tracing::warn!(group = %check.group, "no live producer of the group to check a half message with; checked again later");
            continue;
        };
        let sending = producer.connection.remoting.send_oneway(check.request);
        // A producer that does not read must not hold the loop (and shutdown) up.
        let sent = tokio::time::timeout(CHECK_SEND_TIMEOUT, sending)
            .await
            .unwrap_or_else(|_| {
                Err(ConnectionError::Timeout {
                    peer: producer.connection.remote.to_string(),
                    code: code::request::CHECK_TRANSACTION_STATE,
                    timeout_ms: u64::try_from(CHECK_SEND_TIMEOUT.as_millis()).unwrap_or(u64::MAX),
                })
            });
        match sent {
            Ok(()) => broker
                .transactions()
                .checks_sent
                .fetch_add(1, Ordering::Relaxed),
            Err(error) => {
                tracing::warn!(group = %check.group, %error, "sending CHECK_TRANSACTION_STATE failed");
                broker
                    .transactions()
                    .checks_unsent
                    .fetch_add(1, Ordering::Relaxed)
            }
        };
    }
}

/// One walk of the half queue from the settled progress: the checks to send, and the error
/// that cut the walk short, if any. Blocking.
fn check_round(broker: &Broker, now: i64) -> (Vec<CheckBack>, Option<BrokerError>) {
    let transactions = broker.transactions();
    let mut walk = Walk {
        broker,
        now,
        checks: Vec::new(),
    };
    let error = walk.run().err();
    // END_TRANSACTION moves the progress too, between rounds.
    // Nothing is recorded while there is nothing to record (no system group's offsets).
    let recorded = broker.offsets().query(SYSTEM_GROUP, HALF_TOPIC, HALF_QUEUE);
    if recorded.unwrap_or_default() != QueueOffset(transactions.progress()) {
        if let Err(error) = record_progress(broker, transactions.progress()) {
            return (walk.checks, Some(error));
        }
    }
    (walk.checks, error)
}

/// Commits the system group's offsets: the half queue's progress, and the op queue up to the
/// first op record of a half message at or past it. They are persisted with the others: a
/// restart from older ones reads more op records (every done half message has one), no more.
fn record_progress(broker: &Broker, progress: u64) -> Result<(), BrokerError> {
    let offsets = broker.offsets();
    offsets.commit(SYSTEM_GROUP, HALF_TOPIC, HALF_QUEUE, QueueOffset(progress));
    let op_from = offsets
        .query(SYSTEM_GROUP, OP_TOPIC, HALF_QUEUE)
        .unwrap_or_default();
    let mut op_next = op_from.0;
    for_each_op(broker.store(), op_from, |op_offset, half_offset| {
        if half_offset >= progress {
            return false;
        }
        op_next = op_offset + 1;
        true
    })?;
    offsets.commit(SYSTEM_GROUP, OP_TOPIC, HALF_QUEUE, QueueOffset(op_next));
    Ok(())
}

/// The walk of one check round.
struct Walk<'a> {
    broker: &'a Broker,
    now: i64,
    checks: Vec<CheckBack>,
}

/// Where the walk stands after one half message.
enum Visited {
    /// Done with it (settled before, or checked, or discarded now).
    Done(u64),
    /// Left unsettled: still within its CHECK_IMMUNITY_TIME_IN_SECONDS.
    Open(u64),
    /// It is younger than the timeout (so is everything after it) or busy: the round ends.
    Stop,
}

impl Walk<'_> {
    fn run(&mut self) -> Result<(), BrokerError> {
        let store = self.broker.store();
        let transactions = self.broker.transactions();
        let max = store.max_offset(HALF_TOPIC, HALF_QUEUE).0;
        transactions.advance(store.min_offset(HALF_TOPIC, HALF_QUEUE).0);
        let mut next = transactions.next_open(0);
        'walk: while next < max {
            let messages = read_batch(store, HALF_TOPIC, next)?;
            if messages.is_empty() {
                break;
            }
            for raw in &messages {
                next = match self.visit(raw, next)? {
                    Visited::Done(offset) | Visited::Open(offset) => offset + 1,
                    Visited::Stop => break 'walk,
                };
                // Offsets already done are skipped by reading again past them.
                let open = transactions.next_open(next);
                if open != next {
                    next = open;
                    continue 'walk;
                }
            }
        }
        Ok(())
    }

    /// Deals with one half message (expected at queue offset `expected`).
    fn visit(&mut self, raw: &[u8], expected: u64) -> Result<Visited, BrokerError> {
        let transactions = self.broker.transactions();
        let half = match decode(raw) {
            Ok((record, _)) => record,
            Err(error) => {
                tracing::error!(%error, offset = expected, "undecodable half message skipped");
                transactions.settlement.lock().mark_done(expected);
                return Ok(Visited::Done(expected));
            }
        };
        let offset = half.queue_offset.0;
        let claim = match transactions.claim(offset) {
            Claim::Settled => return Ok(Visited::Done(offset)),
            Claim::Busy => return Ok(Visited::Stop),
            Claim::Granted(claim) => claim,
        };
        let config = self.broker.config();
        let timeout_ms = i64::try_from(config.transaction_timeout_ms).unwrap_or(i64::MAX);
        // A checked copy waits the timeout again from when it was re-put.
        if self.now.saturating_sub(half.store_timestamp_ms) < timeout_ms {
            return Ok(Visited::Stop);
        }
        let check_times = property_number(&half, msg::PROPERTY_TRANSACTION_CHECK_TIMES);
        let immunity_ms = property_number(&half, msg::PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
            .saturating_mul(1000);
        if check_times == 0 && self.now.saturating_sub(half.born_timestamp_ms) < immunity_ms {
            return Ok(Visited::Open(offset));
        }
        if check_times >= i64::from(config.transaction_check_max) {
            self.discard(&half, check_times)?;
        } else {
            self.check(&half, check_times + 1)?;
        }
        // Done before the claim is released: a late END then finds it settled.
        claim.settle();
        Ok(Visited::Done(offset))
    }

    /// Moves a half message checked the maximum number of times to CHECK_MAX_TIME_TOPIC.
    fn discard(&mut self, half: &Record, check_times: i64) -> Result<(), BrokerError> {
        self.broker.topics().get_or_create(CHECK_MAX_TIME_TOPIC, 1);
        let target = copy_of(half, CHECK_MAX_TIME_TOPIC, half.properties.clone());
        let done = op_target(self.broker, half.queue_offset.0);
        store_message(self.broker, &[target, done]).map_err(BrokerError::store("put"))?;
        self.broker
            .transactions()
            .discarded
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            real_topic = msg_property(half, msg::PROPERTY_REAL_TOPIC),
            producer_group = msg_property(half, msg::PROPERTY_PRODUCER_GROUP),
            transaction_id = msg_property(half, msg::PROPERTY_UNIQ_KEY),
            check_times,
            "half message checked back the maximum number of times without an outcome; discarded to {CHECK_MAX_TIME_TOPIC}"
        );
        Ok(())
    }

    /// Re-puts the half message with its check count and queues the check of the copy.
    fn check(&mut self, half: &Record, check_times: i64) -> Result<(), BrokerError> {
        let mut properties = half.properties_map();
        properties.insert(
            msg::PROPERTY_TRANSACTION_CHECK_TIMES.to_owned(),
            check_times.to_string(),
        );
        let properties =
            encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let copy = copy_of(half, HALF_TOPIC, properties);
        // The original's op record goes with its copy: after a restart it is not re-put again.
        let done = op_target(self.broker, half.queue_offset.0);
        let stored =
            store_message(self.broker, &[copy.clone(), done]).map_err(BrokerError::store("put"))?;
        let Some(group) = msg_property(half, msg::PROPERTY_PRODUCER_GROUP) else {
            tracing::warn!(
                offset = half.queue_offset.0,
                "half message without PGROUP: nobody to check it with"
            );
            return Ok(());
        };
        let placement = Placement {
            queue_offset: stored[0].queue_offset,
            physical_offset: stored[0].physical_offset,
            store_timestamp_ms: stored[0].store_timestamp_ms,
        };
        let request = check_request(self.broker, half, &copy, placement);
        self.checks.push(CheckBack {
            group: group.to_owned(),
            request,
        });
        Ok(())
    }
}

/// CHECK_TRANSACTION_STATE for the stored copy: the header as Apache's `Broker2Client`
/// fills it, the body the message as the producer sent it (real topic and queue).
fn check_request(
    broker: &Broker,
    half: &Record,
    copy: &StoreTarget,
    placement: Placement,
) -> RemotingCommand {
    let offset_msg_id = msg::offset_msg_id(broker.store_host(), placement.physical_offset.0);
    let real_topic = msg_property(half, msg::PROPERTY_REAL_TOPIC).unwrap_or(HALF_TOPIC);
    let real_queue = msg_property(half, msg::PROPERTY_REAL_QID)
        .and_then(|q| q.parse().ok())
        .unwrap_or(HALF_QUEUE);
    let header = CheckTransactionStateRequestHeader {
        tran_state_table_offset: i64::try_from(placement.queue_offset.0).unwrap_or(i64::MAX),
        commit_log_offset: i64::try_from(placement.physical_offset.0).unwrap_or(i64::MAX),
        msg_id: Some(offset_msg_id.clone()),
        transaction_id: msg_property(half, msg::PROPERTY_UNIQ_KEY).map(str::to_owned),
        offset_msg_id: Some(offset_msg_id),
        topic: Some(real_topic.to_owned()),
        broker_name: Some(broker.config().broker_name.clone()),
    };
    let message = record::NewMessage {
        topic: real_topic,
        queue_id: real_queue,
        flag: copy.flag,
        body: &copy.body,
        properties: &copy.properties,
        sys_flag: copy.sys_flag,
        born_timestamp_ms: copy.born_timestamp_ms,
        born_host: copy.born_host,
        store_host: broker.store_host(),
        reconsume_times: copy.reconsume_times,
        prepared_transaction_offset: 0,
    };
    let body = record::encode(&message, placement).unwrap_or_default();
    RemotingCommand::request(code::request::CHECK_TRANSACTION_STATE, header.to_ext())
        .with_body(Bytes::from(body))
        .into_oneway()
}

fn msg_property<'r>(record: &'r Record, key: &str) -> Option<&'r str> {
    record::property(&record.properties, key)
}

/// A numeric property, 0 when absent or not a number.
fn property_number(record: &Record, key: &str) -> i64 {
    msg_property(record, key)
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0)
}
