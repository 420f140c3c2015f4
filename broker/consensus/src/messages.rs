//! The bodies of the messages this crate adds to Raft's: a proposal forwarded to
//! the leader ("propose"), a probe of whether the group exists ("probe"), a
//! rejoin request ("rejoin") and the leader's request to campaign ("elect"), each
//! JSON.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::CommandOutcome;

/// The answer to a forwarded proposal (kind "propose").
#[derive(Serialize, Deserialize)]
pub(crate) enum ProposeReply {
    Done(CommandOutcome),
    NotLeader {
        leader: Option<u64>,
    },
    /// The leader could not commit it in time (no quorum); it may still be.
    TimedOut,
    Failed(String),
}

/// A member with an empty directory asks (kind "probe").
#[derive(Serialize, Deserialize)]
pub(crate) struct ProbeRequest {
    pub(crate) from: u64,
    pub(crate) nonce: u64,
}

/// The answer to a probe.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub(crate) enum ProbeReply {
    /// This member has no Raft state either and has not decided anything; `nonce`
    /// tells this start of it apart from any other.
    Fresh { nonce: u64 },
    /// This member is (or is becoming) a Raft node of the group: the group exists.
    Member {
        node: u64,
        voters: BTreeSet<u64>,
        learners: BTreeSet<u64>,
        /// The leader's member id.
        leader: Option<u64>,
        /// If the group was created brand-new: the members it counted as
        /// uninitialized, with the nonces they answered.
        founders: BTreeMap<u64, u64>,
    },
}

/// A rejoining member asks the leader to make its new node a voter (kind "rejoin").
#[derive(Serialize, Deserialize)]
pub(crate) struct RejoinRequest {
    pub(crate) member: u64,
    pub(crate) node: u64,
}

#[derive(Serialize, Deserialize, Debug)]
pub(crate) enum RejoinReply {
    /// The node is a voter of the group's (uniform) membership.
    Done,
    /// The leader has added it as a learner and is waiting for it to catch up.
    InProgress,
    /// The leader is rejoining another member first (one change at a time).
    Busy {
        member: u64,
    },
    NotLeader {
        leader: Option<u64>,
    },
    Refused(String),
}

/// The leader asks a caught-up voter to campaign at once, handing it leadership
/// (kind "elect"); `node` is the Raft node meant to campaign.
#[derive(Serialize, Deserialize)]
pub(crate) struct ElectRequest {
    pub(crate) node: u64,
}
