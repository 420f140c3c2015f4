//! The errors of [`Consensus`](crate::Consensus).

use std::time::Duration;

/// Errors of [`Consensus`](crate::Consensus).
#[derive(Debug, thiserror::Error)]
pub enum ConsensusError {
    #[error("invalid consensus config: {0}")]
    Config(String),
    #[error("consensus storage: {0}")]
    Storage(#[from] std::io::Error),
    /// The request needs the leader and this member is not (it may know who is).
    #[error("not the consensus leader (leader: {leader:?})")]
    NotLeader { leader: Option<u64> },
    /// No answer in time: no leader, or no quorum. A timed-out proposal may
    /// still be applied later (its outcome is unknown); read the state.
    #[error("consensus request timed out after {0:?}")]
    Timeout(Duration),
    /// openraft stopped (shut down or a fatal storage error).
    #[error("consensus: {0}")]
    Raft(String),
    #[error("consensus message of kind {kind}: {error}")]
    Codec { kind: String, error: String },
    #[error("unknown consensus message kind {0:?}")]
    UnknownKind(String),
    /// A Raft message reached a member that has not yet found out whether its
    /// group exists (its directory was empty): it takes none until it knows
    /// which Raft node it is.
    #[error("this member has not joined the group's consensus yet")]
    NotJoined,
    /// A Raft message for another Raft node of this member: one it was before it
    /// lost its directory. Refused, so the leader sees that node unreachable
    /// rather than its log reverted.
    #[error("consensus message for raft node {to}; this member is raft node {node}")]
    WrongNode { to: u64, node: u64 },
    /// A membership change that was refused, or did not finish (the reason says which).
    #[error("membership change: {0}")]
    Membership(String),
    /// A leadership transfer that was refused, or did not finish (the reason says which).
    #[error("leadership transfer: {0}")]
    Transfer(String),
    /// The directory's stored membership is not the configured one (see
    /// [`stored_members`](crate::stored_members)).
    #[error("the configured members {configured:?} are not the group's membership {stored:?} stored in {dir}")]
    MembersMismatch {
        configured: std::collections::BTreeMap<u64, String>,
        stored: std::collections::BTreeMap<u64, String>,
        dir: String,
    },
}
