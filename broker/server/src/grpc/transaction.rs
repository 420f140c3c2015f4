//! Transactions over gRPC: the transaction id a send answers for a half message says where
//! it is (so EndTransaction needs no lookup), and the check-back loop's CHECK_TRANSACTION_STATE
//! becomes a `RecoverOrphanedTransactionCommand` on a producer's Telemetry stream.

use quiver_grpc_proto::v2::{self, Code, TransactionResolution, TransactionSource};
use quiver_protocol::header::CheckTransactionStateRequestHeader;
use quiver_protocol::record;
use quiver_protocol::RemotingCommand;

use super::call::name;
use super::convert::outgoing;
use super::status::{self, ok, status};
use crate::broker::Broker;
use crate::grpc_state::GrpcState;
use crate::service::transaction::{end_transaction, Ending};

/// Where a half message is: its CommitLog offset and its queue offset in the half topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionHandle {
    pub commit_log_offset: u64,
    pub half_offset: u64,
}

impl TransactionHandle {
    /// 32 upper-case hex digits: the CommitLog offset, then the half queue offset.
    pub fn encode(&self) -> String {
        format!("{:016X}{:016X}", self.commit_log_offset, self.half_offset)
    }

    pub fn decode(text: &str) -> Option<TransactionHandle> {
        if text.len() != 32 || !text.is_ascii() {
            return None;
        }
        let (commit_log, half) = text.split_at(16);
        Some(TransactionHandle {
            commit_log_offset: u64::from_str_radix(commit_log, 16).ok()?,
            half_offset: u64::from_str_radix(half, 16).ok()?,
        })
    }
}

/// EndTransaction: commits or rolls back the half message the transaction id names. The
/// producer group of a 5.x half message is its topic (as Apache's Proxy records it).
pub(crate) async fn end(
    broker: &Broker,
    request: &v2::EndTransactionRequest,
) -> Result<v2::EndTransactionResponse, v2::Status> {
    let topic = name(request.topic.as_ref());
    let Some(handle) = TransactionHandle::decode(&request.transaction_id) else {
        return Err(status(
            Code::InvalidTransactionId,
            format!(
                "transaction id {:?} was not issued by this broker",
                request.transaction_id
            ),
        ));
    };
    let commit = match request.resolution() {
        TransactionResolution::Commit => true,
        TransactionResolution::Rollback => false,
        // Not known yet: the check-back asks again later.
        TransactionResolution::Unspecified => return Ok(ended()),
    };
    let ending = Ending {
        producer_group: topic,
        commit,
        half_offset: handle.half_offset,
        commit_log_offset: i64::try_from(handle.commit_log_offset).unwrap_or(i64::MAX),
        from_check: request.source() == TransactionSource::SourceServerCheck,
    };
    end_transaction(broker, ending)
        .await
        .map_err(status::of_ending)?;
    Ok(ended())
}

fn ended() -> v2::EndTransactionResponse {
    v2::EndTransactionResponse { status: Some(ok()) }
}

/// Sends a CHECK_TRANSACTION_STATE of the check-back loop to a 5.x producer of the half
/// message's topic as a `RecoverOrphanedTransactionCommand`; false when no such producer
/// has a Telemetry stream open here, or the half message came from a 4.x producer group
/// (a 5.x half message's producer group is its topic). The port registers it with
/// [`GrpcState::serve_check_backs`] as it starts serving.
pub(crate) fn check_back(grpc: &GrpcState, producer_group: &str, check: &RemotingCommand) -> bool {
    let Ok(header) = CheckTransactionStateRequestHeader::from_command(check) else {
        return false;
    };
    let Ok((message, _)) = record::decode(&check.body) else {
        return false;
    };
    let handle = TransactionHandle {
        commit_log_offset: u64::try_from(header.commit_log_offset).unwrap_or(0),
        half_offset: u64::try_from(header.tran_state_table_offset).unwrap_or(0),
    };
    let topic = message.topic.clone();
    if topic != producer_group {
        return false;
    }
    let store_host = grpc.advertised.get().cloned().unwrap_or_default();
    let command = v2::TelemetryCommand {
        status: Some(ok()),
        command: Some(
            v2::telemetry_command::Command::RecoverOrphanedTransactionCommand(
                v2::RecoverOrphanedTransactionCommand {
                    message: Some(outgoing(&message, &topic, None, &store_host)),
                    transaction_id: handle.encode(),
                },
            ),
        ),
    };
    grpc.sessions.push_to_producer_of(&topic, command)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_refuse_foreign_ids() {
        let handle = TransactionHandle {
            commit_log_offset: 0x1234_5678_9abc,
            half_offset: 42,
        };
        assert_eq!(TransactionHandle::decode(&handle.encode()), Some(handle));
        assert_eq!(
            TransactionHandle::decode("7F000001000000000000000000001234"),
            Some(TransactionHandle {
                commit_log_offset: 0x7F00_0001_0000_0000,
                half_offset: 0x1234
            })
        );
        assert_eq!(TransactionHandle::decode("not-a-handle"), None);
        assert_eq!(TransactionHandle::decode(&"Z".repeat(32)), None);
    }
}
