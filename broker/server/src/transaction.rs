//! Transactional messages as Apache RocketMQ keeps them (`TransactionalMessageServiceImpl`,
//! `TransactionalMessageCheckService`): a half message waits in [`HALF_TOPIC`] queue 0 with
//! its real topic and queue in properties; END_TRANSACTION writes an op record (body: the
//! half queue offset, tag "d") to [`OP_TOPIC`]; the check-back service asks the producer
//! group about half messages without one, re-putting each with its check count, and
//! discards them to [`CHECK_MAX_TIME_TOPIC`] past the limit.
//!
//! How far the half queue is settled (`progress`) and how far the op queue is read are the
//! system group [`SYSTEM_GROUP`]'s consumer offsets: persisted with the others, and read
//! back on open so a restart re-reads only the op records past them.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use quiver_protocol::header::CheckTransactionStateRequestHeader;
use quiver_protocol::message::{self as msg, sys_flag};
use quiver_protocol::record::{self, decode, encode_properties, Placement, Record};
use quiver_protocol::{code, RemotingCommand};
use quiver_remoting::ConnectionError;
use quiver_store::{ConsumerOffsets, GetStatus, MessageStore, QueueOffset};
use rangemap::RangeSet;
use std::ops::ControlFlow;

use crate::broker::{blocking, Broker};
use crate::error::{chain, BrokerError};
use crate::service::produce::{store_message, StoreTarget};

/// Where half messages wait for their outcome (Apache's name).
pub const HALF_TOPIC: &str = "RMQ_SYS_TRANS_HALF_TOPIC";
/// One op record per settled half message.
pub const OP_TOPIC: &str = "RMQ_SYS_TRANS_OP_HALF_TOPIC";
/// Where half messages go once checked back the maximum number of times.
pub const CHECK_MAX_TIME_TOPIC: &str = "TRANS_CHECK_MAX_TIME_TOPIC";
/// The system group whose offsets record the settled progress.
pub const SYSTEM_GROUP: &str = "CID_RMQ_SYS_TRANS";
/// The tag of op records ("delete", as Apache's `REMOVETAG`).
pub const OP_REMOVE_TAG: &str = "d";
pub const HALF_QUEUE: u32 = 0;

/// Half and op records read per store get.
const SCAN_BATCH: u32 = 64;
const SCAN_BYTES: u64 = 16 * 1024 * 1024;
/// How long a check may wait for room in a producer connection's outbound queue.
const CHECK_SEND_TIMEOUT: Duration = Duration::from_secs(3);

/// The settlement state of the half queue, shared by END_TRANSACTION and the checker.
#[derive(Default)]
pub struct Transactions {
    settlement: Mutex<Settlement>,
    checks_sent: AtomicU64,
    checks_unsent: AtomicU64,
    discarded: AtomicU64,
}

#[derive(Default)]
struct Settlement {
    /// Half queue offsets below this are done: settled, re-put as a checked copy, or
    /// discarded (each has an op record).
    progress: u64,
    /// Done offsets at or above `progress`, as coalesced ranges: under load nearly every
    /// offset behind an unsettled one is done, so this stays a few ranges.
    done: RangeSet<u64>,
    /// Offsets an END_TRANSACTION or the checker is acting on right now.
    busy: BTreeSet<u64>,
}

impl Settlement {
    fn is_done(&self, offset: u64) -> bool {
        offset < self.progress || self.done.contains(&offset)
    }

    fn mark_done(&mut self, offset: u64) {
        if offset >= self.progress {
            self.done.insert(offset..offset + 1);
        }
        self.advance(self.progress);
    }

    /// Moves `progress` to at least `floor`, then over the done ranges it meets.
    fn advance(&mut self, floor: u64) {
        self.progress = self.progress.max(floor);
        while let Some(first) = self.done.first().cloned() {
            if first.start > self.progress {
                break;
            }
            self.progress = self.progress.max(first.end);
            self.done.remove(first);
        }
    }

    /// The first offset from `offset` on that is not done.
    fn next_open(&self, offset: u64) -> u64 {
        let offset = offset.max(self.progress);
        self.done.get(&offset).map_or(offset, |range| range.end)
    }
}

/// Whether a half message may be acted on.
pub enum Claim<'a> {
    /// It is unsettled and now reserved for the holder of the guard.
    Granted(ClaimGuard<'a>),
    /// It has an op record, or was re-put or discarded: nothing to do.
    Settled,
    /// Someone else is acting on it.
    Busy,
}

/// Releases a claimed half offset when dropped; [`ClaimGuard::settle`] records it settled.
pub struct ClaimGuard<'a> {
    transactions: &'a Transactions,
    offset: u64,
}

impl ClaimGuard<'_> {
    /// The op record is stored: the half message is done for good.
    pub fn settle(self) {
        self.transactions.settlement.lock().mark_done(self.offset);
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.transactions
            .settlement
            .lock()
            .busy
            .remove(&self.offset);
    }
}

/// (checks sent, checks without a live producer connection, half messages discarded).
pub type TransactionCounts = (u64, u64, u64);

impl Transactions {
    /// The state recorded by the system group's offsets and the op records after them.
    pub fn load(store: &MessageStore, offsets: &ConsumerOffsets) -> Result<Self, BrokerError> {
        let progress = offsets
            .query(SYSTEM_GROUP, HALF_TOPIC, HALF_QUEUE)
            .unwrap_or_default()
            .max(store.min_offset(HALF_TOPIC, HALF_QUEUE));
        let op_from = offsets
            .query(SYSTEM_GROUP, OP_TOPIC, HALF_QUEUE)
            .unwrap_or_default();
        let mut settlement = Settlement {
            progress: progress.0,
            ..Settlement::default()
        };
        let mut ops = 0u64;
        for_each_op(store, op_from, |_, half_offset| {
            settlement.mark_done(half_offset);
            ops += 1;
            true
        })?;
        if ops > 0 || progress.0 > 0 {
            tracing::info!(
                progress = settlement.progress,
                ops,
                done_ranges = settlement.done.len(),
                "transaction state loaded"
            );
        }
        Ok(Transactions {
            settlement: Mutex::new(settlement),
            ..Transactions::default()
        })
    }

    /// Rebuilds the settlement from the store, as at open: a group member that becomes the
    /// master settles from the half and op records it mirrored, not from what it knew when
    /// it last was.
    pub fn reload(
        &self,
        store: &MessageStore,
        offsets: &ConsumerOffsets,
    ) -> Result<(), BrokerError> {
        let loaded = Transactions::load(store, offsets)?;
        *self.settlement.lock() = loaded.settlement.into_inner();
        Ok(())
    }

    /// Reserves the half message at `offset` for one END_TRANSACTION or check.
    pub fn claim(&self, offset: u64) -> Claim<'_> {
        let mut settlement = self.settlement.lock();
        if settlement.is_done(offset) {
            return Claim::Settled;
        }
        if !settlement.busy.insert(offset) {
            return Claim::Busy;
        }
        Claim::Granted(ClaimGuard {
            transactions: self,
            offset,
        })
    }

    pub fn progress(&self) -> u64 {
        self.settlement.lock().progress
    }

    /// Nothing below `floor` is left in the half queue (retention deleted it).
    fn advance(&self, floor: u64) {
        self.settlement.lock().advance(floor);
    }

    fn next_open(&self, offset: u64) -> u64 {
        self.settlement.lock().next_open(offset)
    }

    pub fn counts(&self) -> TransactionCounts {
        (
            self.checks_sent.load(Ordering::Relaxed),
            self.checks_unsent.load(Ordering::Relaxed),
            self.discarded.load(Ordering::Relaxed),
        )
    }
}

/// Calls `visit(op queue offset, half queue offset)` for each op record from `from` on,
/// until it returns false.
fn for_each_op(
    store: &MessageStore,
    from: QueueOffset,
    mut visit: impl FnMut(u64, u64) -> bool,
) -> Result<(), BrokerError> {
    let max = store.max_offset(OP_TOPIC, HALF_QUEUE).0;
    let mut next = from.0.max(store.min_offset(OP_TOPIC, HALF_QUEUE).0);
    while next < max {
        let messages = read_batch(store, OP_TOPIC, next)?;
        if messages.is_empty() {
            return Ok(());
        }
        for raw in &messages {
            let Ok((record, _)) = decode(raw) else {
                next += 1;
                continue;
            };
            next = record.queue_offset.0 + 1;
            // Apache 5 batches offsets in one op body, comma-separated.
            let body = String::from_utf8_lossy(&record.body);
            for half_offset in body.split(',').filter_map(|o| o.trim().parse::<u64>().ok()) {
                if !visit(record.queue_offset.0, half_offset) {
                    return Ok(());
                }
            }
        }
    }
    Ok(())
}

/// Up to a batch of queue 0's records of `topic` from `offset`; none past the end.
fn read_batch(store: &MessageStore, topic: &str, offset: u64) -> Result<Vec<Bytes>, BrokerError> {
    let got = store
        .get(
            topic,
            HALF_QUEUE,
            QueueOffset(offset),
            SCAN_BATCH,
            SCAN_BYTES,
            &|_| true,
        )
        .map_err(BrokerError::store("get"))?;
    if got.status != GetStatus::Found {
        return Ok(Vec::new());
    }
    Ok(got.messages)
}

/// The op record that settles the half message at `half_offset`.
pub(crate) fn op_target(broker: &Broker, half_offset: u64) -> StoreTarget {
    broker.topics().get_or_create(OP_TOPIC, 1);
    StoreTarget {
        topic: OP_TOPIC.to_owned(),
        queue_id: HALF_QUEUE,
        flag: 0,
        body: Bytes::from(half_offset.to_string()),
        properties: encode_properties([
            (msg::PROPERTY_TAGS, OP_REMOVE_TAG),
            (msg::PROPERTY_WAIT, "false"),
        ]),
        sys_flag: 0,
        born_timestamp_ms: crate::now_ms(),
        born_host: broker.store_host(),
        reconsume_times: 0,
        prepared_transaction_offset: 0,
    }
}

/// The committed message: the half message in its real topic and queue, sysFlag COMMIT,
/// without REAL_TOPIC, REAL_QID and TRAN_MSG (as Apache's EndTransactionProcessor).
pub(crate) fn committed_target(half: &Record) -> Option<StoreTarget> {
    let mut properties = half.properties_map();
    let topic = properties.remove(msg::PROPERTY_REAL_TOPIC)?;
    let queue_id = properties
        .remove(msg::PROPERTY_REAL_QID)
        .and_then(|q| q.parse::<u32>().ok())?;
    properties.remove(msg::PROPERTY_TRANSACTION_PREPARED);
    Some(StoreTarget {
        topic,
        queue_id,
        flag: half.flag,
        body: half.body.clone(),
        properties: encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str()))),
        sys_flag: sys_flag::with_transaction_type(half.sys_flag, sys_flag::TRANSACTION_COMMIT),
        born_timestamp_ms: half.born_timestamp_ms,
        born_host: half.born_host,
        reconsume_times: half.reconsume_times,
        prepared_transaction_offset: i64::try_from(half.physical_offset.0).unwrap_or(i64::MAX),
    })
}

/// The same half message in `topic`, with `properties`.
fn copy_of(half: &Record, topic: &str, properties: String) -> StoreTarget {
    StoreTarget {
        topic: topic.to_owned(),
        queue_id: HALF_QUEUE,
        flag: half.flag,
        body: half.body.clone(),
        properties,
        sys_flag: half.sys_flag,
        born_timestamp_ms: half.born_timestamp_ms,
        born_host: half.born_host,
        reconsume_times: half.reconsume_times,
        prepared_transaction_offset: 0,
    }
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

/// Sends each check over a live connection of its producer group (the newest heartbeat).
async fn send_checks(broker: &Broker, checks: Vec<CheckBack>) {
    for check in checks {
        if crate::grpc::check_back(broker, &check.group, &check.request) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn done_ranges(settlement: &Settlement) -> Vec<std::ops::Range<u64>> {
        settlement.done.iter().cloned().collect()
    }

    #[test]
    fn progress_moves_over_done_offsets_and_the_rest_stays_ranges() {
        let mut settlement = Settlement::default();
        for offset in [3, 4, 6, 5, 9] {
            settlement.mark_done(offset);
        }
        assert_eq!(settlement.progress, 0);
        assert_eq!(done_ranges(&settlement), [3..7, 9..10]);
        assert_eq!(settlement.next_open(3), 7);
        assert_eq!(settlement.next_open(7), 7);
        assert!(settlement.is_done(4) && !settlement.is_done(7) && !settlement.is_done(0));
        settlement.mark_done(0);
        assert_eq!(settlement.progress, 1);
        settlement.mark_done(2);
        settlement.mark_done(1);
        assert_eq!(settlement.progress, 7, "0..7 all done");
        assert_eq!(done_ranges(&settlement), vec![(9..10)]);
        // Retention deleted the queue's head: a floor past a done range swallows it.
        settlement.advance(12);
        assert_eq!(settlement.progress, 12);
        assert!(settlement.done.is_empty());
        assert!(settlement.is_done(11));
    }

    #[test]
    fn a_claim_is_exclusive_until_released_and_settled_for_good() {
        let transactions = Transactions::default();
        let Claim::Granted(claim) = transactions.claim(5) else {
            panic!("an open offset is granted");
        };
        assert!(matches!(transactions.claim(5), Claim::Busy));
        drop(claim);
        let Claim::Granted(claim) = transactions.claim(5) else {
            panic!("released");
        };
        claim.settle();
        assert!(matches!(transactions.claim(5), Claim::Settled));
        assert!(matches!(transactions.claim(4), Claim::Granted(_)));
    }
}
