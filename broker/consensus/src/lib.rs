//! quiver-consensus: the control plane of a replicated broker group.
//!
//! A broker group is N replicas of one broker name: one master, the others
//! replicate its CommitLog. Who is master, the epoch, the in-sync replica set
//! and the history of epoch start offsets ([`GroupState`]) are decided through
//! Raft ([openraft]), embedded in every member of the group. Each member runs a
//! [`Consensus`]; the embedding broker carries its messages over its own
//! connections by implementing [`Transport`] on the sending side and calling
//! [`Consensus::handle`] on the receiving side.
//!
//! Changes are [`Command`]s, conditional on the epoch (compare-and-set), so a
//! stale or repeated proposal comes back [`CommandOutcome::Rejected`] with the
//! current state instead of being applied twice.
//!
//! All of Raft's durable state (vote, log, committed id, state machine and
//! snapshot) lives under [`ConsensusConfig::dir`] and is fsynced before the
//! call that changed it returns; a restarted member recovers from it and
//! rejoins.
//!
//! A member whose directory is empty (new, or wiped) never takes part as the
//! Raft node it may have been before: it asks the other members whether the
//! group exists (message "probe"). It creates a brand-new group only with a
//! majority of the members known to be uninitialized; if the group exists, it
//! comes back under a Raft node id the group has never seen (its member id with
//! a new random incarnation, see [`node_id`]), first as a learner, and the
//! leader replaces its old node with the new one once it has caught up
//! (message "rejoin"). See the crate's README for why.
//!
//! The members and their addresses are the group's Raft membership, agreed like
//! any entry: [`Consensus::add_member`] admits a new member (which joins as a
//! rejoining one does: a learner, then a voter once caught up) and
//! [`Consensus::remove_member`] removes one, both on the leader.
//!
//! [`Consensus::transfer_leadership`] hands the leader's role to a caught-up
//! voter (message "elect"), e.g. before the leader stops.

#![forbid(unsafe_code)]

mod bootstrap;
mod config;
mod consensus;
mod error;
mod inner;
mod membership;
mod messages;
mod network;
mod rejoin;
mod state;
mod store;
mod transfer;

use std::future::Future;
// Named by `declare_raft_types!`'s default `SnapshotData`.
use std::io::Cursor;
use std::pin::Pin;

use openraft::BasicNode;

pub use config::ConsensusConfig;
pub use consensus::{Consensus, Phase, Status};
pub use error::ConsensusError;
pub use state::{Command, CommandOutcome, EpochStart, GroupState};
pub use store::stored_members;

openraft::declare_raft_types!(
    /// openraft's type configuration of a broker group.
    pub TypeConfig:
        D = Command,
        R = CommandOutcome,
        NodeId = u64,
        Node = BasicNode,
);

/// The Raft node id of incarnation `incarnation` of member `member` (a member id
/// below 2^32): `incarnation << 32 | member`. Incarnation 0, the one of every
/// member of a brand-new group, is the member id itself (as in directories made
/// before incarnations existed); a member that rejoins after losing its directory
/// takes a random nonzero one, a node id the group has never seen.
pub fn node_id(member: u64, incarnation: u32) -> u64 {
    (u64::from(incarnation) << 32) | member
}

/// The member a Raft node id belongs to (see [`node_id`]).
pub fn member_of(node: u64) -> u64 {
    node & u64::from(u32::MAX)
}

/// The incarnation part of a Raft node id (see [`node_id`]).
pub fn incarnation_of(node: u64) -> u32 {
    (node >> 32) as u32
}

/// A boxed, sendable future (what [`Transport::call`] returns).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A consensus message could not be delivered or answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("transport: {0}")]
pub struct TransportError(pub String);

/// The embedding broker's way of reaching the other members of the group.
pub trait Transport: Send + Sync + 'static {
    /// Sends one consensus message to member `target` (a member id) at `address`
    /// (the one the group's membership agreed for it, or the configured one
    /// before a member knows the membership) and returns its answer: the
    /// bytes the receiver's [`Consensus::handle`] returned for `kind` and
    /// `body`. `kind` is one of `"vote"`, `"append"`, `"snapshot"`,
    /// `"propose"`, `"probe"`, `"rejoin"`, `"elect"` (carry any kind as it is). Any failure
    /// to deliver or to get the answer (including the receiver's `handle`
    /// returning an error) is a [`TransportError`].
    fn call(
        &self,
        target: u64,
        address: &str,
        kind: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>>;
}
