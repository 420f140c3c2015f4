//! Headers of transactional messages, named as Apache's `EndTransactionRequestHeader` and
//! `CheckTransactionStateRequestHeader` name their fields.

use super::{CommandHeader, FieldKind, Optional, Required};
use crate::error::HeaderError;
use crate::{ExtFields, RemotingCommand};

header! {
    /// END_TRANSACTION (37), producer -> broker, usually oneway: the outcome of the local
    /// transaction of the half message at `commitLogOffset` (queue offset
    /// `tranStateTableOffset` of the half topic). `commitOrRollback` is a sysFlag
    /// transaction type: 8 commit, 12 rollback, 0 unknown.
    pub struct EndTransactionRequestHeader {
        req producer_group: String = "producerGroup",
        req tran_state_table_offset: i64 = "tranStateTableOffset",
        req commit_log_offset: i64 = "commitLogOffset",
        req commit_or_rollback: i32 = "commitOrRollback",
        /// True when the producer answers a CHECK_TRANSACTION_STATE.
        opt from_transaction_check: Option<bool> = "fromTransactionCheck",
        req msg_id: String = "msgId",
        opt transaction_id: Option<String> = "transactionId",
    }
}

impl EndTransactionRequestHeader {
    pub fn is_from_transaction_check(&self) -> bool {
        self.from_transaction_check.unwrap_or(false)
    }
}

header! {
    /// CHECK_TRANSACTION_STATE (39), broker -> producer, oneway: asks the outcome of a half
    /// message whose END_TRANSACTION never came; the body is the stored message.
    pub struct CheckTransactionStateRequestHeader {
        req tran_state_table_offset: i64 = "tranStateTableOffset",
        req commit_log_offset: i64 = "commitLogOffset",
        opt msg_id: Option<String> = "msgId",
        opt transaction_id: Option<String> = "transactionId",
        opt offset_msg_id: Option<String> = "offsetMsgId",
        opt topic: Option<String> = "topic",
        opt broker_name: Option<String> = "brokerName",
    }
}
