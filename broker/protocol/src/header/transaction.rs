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

#[cfg(test)]
mod tests {
    use super::*;

    fn ext(pairs: &[(&str, &str)]) -> ExtFields {
        pairs
            .iter()
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect()
    }

    #[test]
    fn end_transaction_reads_the_java_field_names() {
        // As a 4.x Java client's oneway END after a check: transactionId may be absent.
        let header = EndTransactionRequestHeader::from_ext(&ext(&[
            ("producerGroup", "P"),
            ("tranStateTableOffset", "7"),
            ("commitLogOffset", "1234"),
            ("commitOrRollback", "12"),
            ("fromTransactionCheck", "true"),
            ("msgId", "7F0000010000000000000000000004D2"),
        ]))
        .unwrap();
        assert_eq!(header.tran_state_table_offset, 7);
        assert_eq!(header.commit_log_offset, 1234);
        assert_eq!(header.commit_or_rollback, 12);
        assert!(header.is_from_transaction_check());
        assert_eq!(header.transaction_id, None);
        assert!(EndTransactionRequestHeader::from_ext(&ext(&[("producerGroup", "P")])).is_err());
    }

    #[test]
    fn check_transaction_state_round_trips() {
        let header = CheckTransactionStateRequestHeader {
            tran_state_table_offset: 3,
            commit_log_offset: 99,
            msg_id: Some("id".into()),
            transaction_id: Some("tx".into()),
            offset_msg_id: None,
            topic: Some("T".into()),
            broker_name: Some("broker-0".into()),
        };
        let ext = header.to_ext();
        assert_eq!(ext.get("tranStateTableOffset"), Some("3"));
        assert_eq!(ext.get("transactionId"), Some("tx"));
        assert_eq!(
            CheckTransactionStateRequestHeader::from_ext(&ext).unwrap(),
            header
        );
    }
}
