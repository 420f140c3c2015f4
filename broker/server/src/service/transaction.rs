//! Ending a transaction: its half message committed to its real topic and queue, or rolled
//! back, with the op record that settles it (Apache's `EndTransactionProcessor`). An ending
//! for a half message already settled does nothing.

use quiver_protocol::message as msg;
use quiver_protocol::record::{property, Record};
use quiver_protocol::CommitLogOffset;

use bytes::Bytes;
use quiver_protocol::record::encode_properties;

use super::produce::{park_if_delayed, store_message_async, topic_for_send, StoreTarget};
use super::ServiceError;
use crate::broker::Broker;
use crate::transaction::{self, committed_target, Claim, HALF_QUEUE, OP_REMOVE_TAG, OP_TOPIC};

/// A transaction's outcome, as END_TRANSACTION or a 5.x client's EndTransaction gives it.
pub(crate) struct Ending<'a> {
    pub producer_group: &'a str,
    pub commit: bool,
    /// The half message's queue offset in the half topic.
    pub half_offset: u64,
    /// The half message's CommitLog offset.
    pub commit_log_offset: i64,
    pub from_check: bool,
}

/// Commits (to the real topic and queue, delayed if it says so) or rolls back the half
/// message, with its op record in the same append; a settled one is left as it is.
pub(crate) async fn end_transaction(
    broker: &Broker,
    ending: Ending<'_>,
) -> Result<(), ServiceError> {
    let claim = match broker.transactions().claim(ending.half_offset) {
        Claim::Granted(claim) => claim,
        Claim::Settled | Claim::Busy => {
            tracing::debug!(
                half_offset = ending.half_offset,
                "transaction end for a settled half message ignored"
            );
            return Ok(());
        }
    };
    let half = prepared_message(broker, &ending)?;
    let mut targets = Vec::with_capacity(2);
    if ending.commit {
        let target = committed_target(&half).ok_or_else(|| {
            ServiceError::InvalidTransaction(
                "the half message has no REAL_TOPIC or REAL_QID property".into(),
            )
        })?;
        topic_for_send(broker, &target.topic)?;
        // A delay level or timer the half message carries applies from the commit on.
        targets.push(park_if_delayed(broker, target, crate::now_ms())?);
    }
    // One append: the op record is never stored without the committed message before it.
    targets.push(op_target(broker, ending.half_offset));
    store_message_async(broker, &targets).await?;
    claim.settle();
    tracing::debug!(
        half_offset = ending.half_offset,
        commit = ending.commit,
        from_check = ending.from_check,
        "transaction ended"
    );
    Ok(())
}

/// The half message the ending names, checked as Apache's `checkPrepareMessage` does.
fn prepared_message(broker: &Broker, ending: &Ending<'_>) -> Result<Record, ServiceError> {
    let refuse = |remark: &str| ServiceError::InvalidTransaction(remark.to_owned());
    let offset = u64::try_from(ending.commit_log_offset)
        .map_err(|_| refuse("The commit log offset wrong"))?;
    let half = broker
        .store()
        .read_record(CommitLogOffset(offset))
        .map_err(|_| refuse("Find prepared transaction message failed"))?;
    if half.topic != transaction::HALF_TOPIC {
        return Err(refuse(
            "The message at commitLogOffset is not a half message",
        ));
    }
    if property(&half.properties, msg::PROPERTY_PRODUCER_GROUP) != Some(ending.producer_group) {
        return Err(refuse("The producer group wrong"));
    }
    if half.queue_offset.0 != ending.half_offset {
        return Err(refuse("The transaction state table offset wrong"));
    }
    Ok(half)
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
