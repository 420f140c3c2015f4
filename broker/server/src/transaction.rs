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

use bytes::Bytes;
use parking_lot::Mutex;
use quiver_protocol::message::{self as msg, sys_flag};
use quiver_protocol::record::{decode, encode_properties, Record};
use quiver_store::{ConsumerOffsets, GetStatus, MessageStore, QueueOffset};
use rangemap::RangeSet;

use crate::error::BrokerError;
use crate::target::StoreTarget;

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
/// The settlement state of the half queue, shared by END_TRANSACTION and the checker.
#[derive(Default)]
pub struct Transactions {
    pub(crate) settlement: Mutex<Settlement>,
    pub(crate) checks_sent: AtomicU64,
    pub(crate) checks_unsent: AtomicU64,
    pub(crate) discarded: AtomicU64,
}

#[derive(Default)]
pub(crate) struct Settlement {
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

    pub(crate) fn mark_done(&mut self, offset: u64) {
        if offset >= self.progress {
            self.done.insert(offset..offset + 1);
        }
        self.advance(self.progress);
    }

    /// Moves `progress` to at least `floor`, then over the done ranges it meets.
    pub(crate) fn advance(&mut self, floor: u64) {
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
    pub(crate) fn next_open(&self, offset: u64) -> u64 {
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
    pub(crate) fn advance(&self, floor: u64) {
        self.settlement.lock().advance(floor);
    }

    pub(crate) fn next_open(&self, offset: u64) -> u64 {
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
pub(crate) fn for_each_op(
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
pub(crate) fn read_batch(
    store: &MessageStore,
    topic: &str,
    offset: u64,
) -> Result<Vec<Bytes>, BrokerError> {
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

/// The committed message: the half message in its real topic and queue, sysFlag COMMIT,
/// without REAL_TOPIC, REAL_QID and TRAN_MSG (as Apache's EndTransactionProcessor).
pub(crate) fn committed_target(half: &Record) -> Option<StoreTarget> {
    let mut properties = half.properties_map();
    let topic = properties.remove(msg::PROPERTY_REAL_TOPIC)?;
    let queue_id = properties
        .remove(msg::PROPERTY_REAL_QID)
        .and_then(|q| q.parse::<u32>().ok())?;
    properties.remove(msg::PROPERTY_TRANSACTION_PREPARED);
    let properties = encode_properties(properties.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    Some(StoreTarget {
        sys_flag: sys_flag::with_transaction_type(half.sys_flag, sys_flag::TRANSACTION_COMMIT),
        prepared_transaction_offset: i64::try_from(half.physical_offset.0).unwrap_or(i64::MAX),
        ..StoreTarget::copy_of(half, topic, queue_id, properties)
    })
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
