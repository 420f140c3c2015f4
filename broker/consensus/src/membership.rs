//! Membership changes, on the consensus leader: adding a member (it asks to join as a
//! member that lost its directory does: the leader adds its node as a learner, catches
//! it up, then makes it a voter), and removing one. The members and their addresses are
//! openraft's membership (each node's `BasicNode::addr`), agreed like any entry.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::error::{ClientWriteError, RaftError};
use openraft::{BasicNode, ChangeMembers, RaftMetrics, ServerState};
use tokio::sync::watch;

use crate::inner::{lock, members_of, Inner, Node};
use crate::{member_of, Consensus, ConsensusError};

type Metrics = RaftMetrics<u64, BasicNode>;

impl Inner {
    /// This member's node if it leads (as far as it knows); NotLeader naming the leader
    /// otherwise.
    pub(crate) fn leading_node(&self) -> Result<&Node, ConsensusError> {
        let node = self
            .node
            .get()
            .ok_or(ConsensusError::NotLeader { leader: None })?;
        let m = node.metrics.borrow();
        if m.state == ServerState::Leader && m.current_leader == Some(node.id) {
            drop(m);
            return Ok(node);
        }
        Err(ConsensusError::NotLeader {
            leader: m.current_leader.map(member_of),
        })
    }
}

/// Whether `member` has a voter node in `m`'s membership, and no change is under way.
fn is_voter(m: &Metrics, member: u64) -> bool {
    let configs = m.membership_config.membership().get_joint_config();
    configs.len() == 1
        && configs[0].iter().any(|node| member_of(*node) == member)
        && membership_committed(m)
}

/// Whether `m`'s membership is committed (applied here): openraft refuses another change
/// until it is.
fn membership_committed(m: &Metrics) -> bool {
    let entry = m.membership_config.log_id();
    entry.is_none()
        || m.last_applied
            .is_some_and(|applied| Some(applied) >= *entry)
}

/// The members of `m`'s membership as `add_member` and `remove_member` answer them.
fn members_now(m: &Metrics) -> BTreeMap<u64, String> {
    members_of(m.membership_config.membership())
}

fn change_error(e: RaftError<u64, ClientWriteError<u64, BasicNode>>) -> ConsensusError {
    match e {
        RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => ConsensusError::NotLeader {
            leader: f.leader_id.map(member_of),
        },
        RaftError::APIError(ClientWriteError::ChangeMembershipError(e)) => {
            ConsensusError::Membership(e.to_string())
        }
        other => ConsensusError::Raft(other.to_string()),
    }
}

impl Consensus {
    /// The group's members and their addresses as this member knows its membership
    /// (voters and learners; the configured members until it knows one). Changes as
    /// membership changes are agreed.
    pub fn members(&self) -> watch::Receiver<BTreeMap<u64, String>> {
        self.inner.members.subscribe()
    }

    /// On the leader: adds `member` at `address` and returns the membership once it is a
    /// voter. The member must be started (with an empty directory, listing itself among
    /// its members): it asks the leader to join, which adds its node as a learner, waits
    /// until it has the log, and makes it a voter. Answers at once if it already is one at
    /// that address. Bounded by `timeout`; NotLeader (naming the leader) off the leader.
    pub async fn add_member(
        &self,
        member: u64,
        address: &str,
        timeout: Duration,
    ) -> Result<BTreeMap<u64, String>, ConsensusError> {
        let inner = &self.inner;
        let node = inner.leading_node()?;
        if member > u64::from(u32::MAX) || address.is_empty() {
            return Err(ConsensusError::Membership(format!(
                "member id {member} must be below 2^32 and have an address (got {address:?})"
            )));
        }
        let current = members_now(&node.metrics.borrow());
        match current.get(&member) {
            Some(known) if known != address => {
                return Err(ConsensusError::Membership(format!(
                    "member {member} is already a member, at {known}; remove it first to move it to {address}"
                )))
            }
            Some(_) if is_voter(&node.metrics.borrow(), member) => return Ok(current),
            _ => {}
        }
        {
            let mut admitted = lock(&inner.admitted);
            if let Some(other) = admitted.get(&member).filter(|a| *a != address) {
                return Err(ConsensusError::Membership(format!(
                    "member {member} is being added at {other} already"
                )));
            }
            admitted.insert(member, address.to_owned());
        }
        tracing::info!(
            member,
            address,
            "consensus: adding a member: waiting for it to ask to join"
        );
        let mut metrics = node.metrics.clone();
        let joined = tokio::time::timeout(
            timeout,
            metrics.wait_for(|m| is_voter(m, member) || m.state != ServerState::Leader),
        )
        .await;
        lock(&inner.admitted).remove(&member);
        let joined = match joined {
            Ok(Ok(m)) if is_voter(&m, member) => Ok(members_now(&m)),
            Ok(Ok(m)) => Err(ConsensusError::NotLeader {
                leader: m.current_leader.map(member_of),
            }),
            Ok(Err(_)) => Err(ConsensusError::Raft("the consensus node stopped".into())),
            Err(_) => Err(ConsensusError::Membership(format!(
                "member {member} did not join within {timeout:?}: start it (listing itself at \
                 {address} among its group members) with an empty consensus directory; it asks \
                 the leader to join, is caught up as a learner, then made a voter"
            ))),
        };
        if joined.is_ok() {
            tracing::info!(member, address, "consensus: the added member is a voter");
        }
        joined
    }

    /// On the leader: removes every node of `member` (voter or learner) from the group's
    /// membership and returns the membership after it. Refused for a member the group
    /// does not have and for the last voter; bounded by `timeout` (a timed-out change may
    /// still be agreed later: read the members). NotLeader off the leader.
    pub async fn remove_member(
        &self,
        member: u64,
        timeout: Duration,
    ) -> Result<BTreeMap<u64, String>, ConsensusError> {
        let inner = &self.inner;
        let node = inner.leading_node()?;
        lock(&inner.admitted).remove(&member);
        let (voters, learners, remaining) = {
            let m = node.metrics.borrow();
            let membership = m.membership_config.membership();
            let of_member = |id: &u64| member_of(*id) == member;
            let voters: BTreeSet<u64> = membership.voter_ids().filter(of_member).collect();
            let learners: BTreeSet<u64> = membership.learner_ids().filter(of_member).collect();
            let last = membership.get_joint_config().last().cloned();
            let remaining = last
                .unwrap_or_default()
                .into_iter()
                .filter(|id| !of_member(id));
            (voters, learners, remaining.count())
        };
        if voters.is_empty() && learners.is_empty() {
            let members = members_now(&node.metrics.borrow());
            return Err(ConsensusError::Membership(format!(
                "member {member} is not a member of the group (members: {:?})",
                members.keys().collect::<Vec<_>>()
            )));
        }
        if remaining == 0 {
            return Err(ConsensusError::Membership(format!(
                "member {member} is the group's last voter; it cannot be removed"
            )));
        }
        tracing::info!(member, ?voters, ?learners, "consensus: removing a member");
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out = || {
            ConsensusError::Membership(format!(
                "removing member {member} was not agreed within {timeout:?} (a majority of the \
                 old and of the new members must answer); it may still be: read the members"
            ))
        };
        let mut changes = Vec::new();
        if !voters.is_empty() {
            changes.push(ChangeMembers::RemoveVoters(voters));
        }
        if !learners.is_empty() {
            changes.push(ChangeMembers::RemoveNodes(learners));
        }
        for change in changes {
            // A change under way (a rejoin's promotion, the previous step) finishes first.
            let mut metrics = node.metrics.clone();
            let settled = tokio::time::timeout_at(deadline, metrics.wait_for(membership_committed));
            settled
                .await
                .map_err(|_| timed_out())?
                .map_err(|_| ConsensusError::Raft("the consensus node stopped".into()))?;
            let changed =
                tokio::time::timeout_at(deadline, node.raft.change_membership(change, false));
            changed
                .await
                .map_err(|_| timed_out())?
                .map_err(change_error)?;
        }
        Ok(members_now(&node.metrics.borrow()))
    }
}
