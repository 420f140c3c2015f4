//! END_TRANSACTION (37): commits a half message to its real topic and queue, or rolls it
//! back, writing the op record that settles it (Apache's `EndTransactionProcessor`). An END
//! for a half message already settled does nothing.

use quiver_protocol::code::response;
use quiver_protocol::header::EndTransactionRequestHeader;
use quiver_protocol::message::{self as msg, sys_flag};
use quiver_protocol::record::{property, Record};
use quiver_protocol::{CommitLogOffset, RemotingCommand};

use super::{send, store_message_async, success, Ctx, Outcome, Refusal};
use crate::broker::Broker;
use crate::transaction::{self, committed_target, op_target, Claim};

pub async fn end(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = EndTransactionRequestHeader::from_command(req)?;
    let commit = match header.commit_or_rollback {
        sys_flag::TRANSACTION_COMMIT => true,
        sys_flag::TRANSACTION_ROLLBACK => false,
        sys_flag::TRANSACTION_NOT_TYPE => {
            // The producer does not know yet: the check-back service asks again later.
            tracing::debug!(group = %header.producer_group, msg_id = %header.msg_id, from_check = header.is_from_transaction_check(), "transaction outcome unknown");
            return Ok(success(req, &[]));
        }
        other => {
            return Err(Refusal::new(
                response::SYSTEM_ERROR,
                format!("commitOrRollback {other} is not 8 (commit), 12 (rollback) or 0 (unknown)"),
            ))
        }
    };
    let half_offset = super::queue_offset("tranStateTableOffset", header.tran_state_table_offset)?;
    let ending = Ending {
        producer_group: &header.producer_group,
        commit,
        half_offset: half_offset.0,
        commit_log_offset: header.commit_log_offset,
        from_check: header.is_from_transaction_check(),
    };
    end_transaction(&ctx.broker, ending).await?;
    Ok(success(req, &[]))
}

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
pub(crate) async fn end_transaction(broker: &Broker, ending: Ending<'_>) -> Result<(), Refusal> {
    let claim = match broker.transactions.claim(ending.half_offset) {
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
            Refusal::new(
                response::SYSTEM_ERROR,
                "the half message has no REAL_TOPIC or REAL_QID property",
            )
        })?;
        send::topic_for_send(broker, &target.topic)?;
        // A delay level or timer the half message carries applies from the commit on.
        targets.push(send::park_if_delayed(broker, target, crate::now_ms())?);
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
fn prepared_message(broker: &Broker, ending: &Ending<'_>) -> Result<Record, Refusal> {
    let refuse = |remark: &str| Refusal::new(response::SYSTEM_ERROR, remark.to_owned());
    let offset = u64::try_from(ending.commit_log_offset)
        .map_err(|_| refuse("The commit log offset wrong"))?;
    let half = broker
        .store
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
