//! END_TRANSACTION (37): decoded and handed to the transaction service, which commits the
//! half message to its real topic and queue or rolls it back.

use quiver_protocol::code::response;
use quiver_protocol::header::EndTransactionRequestHeader;
use quiver_protocol::message::sys_flag;
use quiver_protocol::RemotingCommand;

use super::{success, Ctx, Outcome, Refusal};
use crate::service::transaction::{end_transaction, Ending};

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
