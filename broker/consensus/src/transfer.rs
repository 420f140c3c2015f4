//! Leadership transfer: the leader asks a caught-up voter to campaign at once (message
//! "elect") and waits until another member leads.
//!
//! openraft 0.9 has no transfer of its own; this works because of how its votes are
//! granted. A voter refuses a vote while its lease on the leader it follows runs
//! (`leader_lease` = `election_timeout_max`), and every heartbeat renews that lease; but
//! the leader's own vote is renewed only by messages it receives, never by the heartbeats
//! it sends. So a leader that has led for longer than the lease grants its vote to a
//! candidate with a higher term and a log as long as its own, and steps down. With the
//! candidate's own vote that is a majority of a group of up to three voters: the candidate
//! leads within a round trip, while the other voter still holds its lease. In a larger
//! group the two are no majority, and the candidate's higher term would only depose the
//! leader (the others refuse until their lease runs out), so a transfer is refused there.

use std::time::Duration;

use openraft::{BasicNode, RaftMetrics, ServerState};
use tokio::time::Instant;

use crate::inner::{lock, Inner, Node};
use crate::messages::ElectRequest;
use crate::network::KIND_ELECT;
use crate::{member_of, Consensus, ConsensusError};

type Metrics = RaftMetrics<u64, BasicNode>;

/// The most voters a transfer works with: the target's vote and the leader's are a majority.
const MAX_VOTERS: usize = 3;

/// Slack on top of the leader's lease: this member sees its leadership in its metrics a
/// little after openraft recorded its vote, so this is only a margin against clock reads.
const LEASE_SLACK: Duration = Duration::from_millis(10);

impl Consensus {
    /// On the leader: hands leadership to member `to` and returns the member that leads
    /// afterwards (`to`, unless another member won an election of its own meanwhile).
    /// `to` must be a voter of a group of at most three voters with no membership change
    /// under way; the leader waits until `to` has matched its whole log and until it has
    /// led for longer than the leader lease (`election_timeout_max_ms`; before that no
    /// voter grants `to` its vote), then asks `to` to campaign (Transport kind "elect").
    /// Bounded by `timeout`; NotLeader off the leader; answers at once if `to` is this
    /// member.
    pub async fn transfer_leadership(
        &self,
        to: u64,
        timeout: Duration,
    ) -> Result<u64, ConsensusError> {
        let inner = &self.inner;
        let node = inner.leading_node()?;
        if to == inner.member {
            return Ok(to);
        }
        let deadline = Instant::now() + timeout;
        let target = transfer_target(&node.metrics.borrow(), to)?;
        inner.await_lease_passed(deadline, timeout).await?;
        await_caught_up(node, to, target, deadline, timeout).await?;
        tracing::info!(to, target, "consensus: handing leadership over");
        let body = serde_json::to_vec(&ElectRequest { node: target }).map_err(|e| {
            ConsensusError::Codec {
                kind: KIND_ELECT.into(),
                error: e.to_string(),
            }
        })?;
        let address = inner.address(to).unwrap_or_default();
        let asked = inner.transport.call(to, &address, KIND_ELECT, body);
        match tokio::time::timeout_at(deadline, asked).await {
            Err(_) => return Err(not_taken(to, timeout, None)),
            Ok(Err(e)) => {
                return Err(ConsensusError::Transfer(format!(
                    "member {to} did not campaign: {e}"
                )))
            }
            Ok(Ok(_)) => {}
        }
        let mut metrics = node.metrics.clone();
        let led = metrics.wait_for(|m| {
            m.running_state.is_err() || m.current_leader.is_some_and(|l| l != node.id)
        });
        let led = tokio::time::timeout_at(deadline, led)
            .await
            .map(|seen| seen.map(|m| (m.running_state.is_ok(), m.current_leader)));
        match led {
            Ok(Ok((true, Some(leader)))) => {
                let leader = member_of(leader);
                tracing::info!(to, leader, "consensus: leadership handed over");
                Ok(leader)
            }
            Ok(_) => Err(ConsensusError::Raft("the consensus node stopped".into())),
            Err(_) => {
                let leader = node.metrics.borrow().current_leader.map(member_of);
                Err(not_taken(to, timeout, leader))
            }
        }
    }
}

fn not_taken(to: u64, timeout: Duration, leader: Option<u64>) -> ConsensusError {
    ConsensusError::Transfer(format!(
        "member {to} did not take over within {timeout:?} (leader now: {leader:?})"
    ))
}

/// The Raft node of voter `to` in `m`'s membership, if a transfer to it can work.
fn transfer_target(m: &Metrics, to: u64) -> Result<u64, ConsensusError> {
    let configs = m.membership_config.membership().get_joint_config();
    let [voters] = configs.as_slice() else {
        return Err(ConsensusError::Transfer(
            "a membership change is under way".into(),
        ));
    };
    let Some(target) = voters.iter().copied().find(|n| member_of(*n) == to) else {
        let members: Vec<u64> = voters.iter().map(|n| member_of(*n)).collect();
        return Err(ConsensusError::Transfer(format!(
            "member {to} is not a voter of the group (voters: {members:?})"
        )));
    };
    if voters.len() > MAX_VOTERS {
        return Err(ConsensusError::Transfer(format!(
            "the group has {} voters; a transfer works with at most {MAX_VOTERS} (the \
             target's vote and the leader's must be a majority while the others hold their \
             lease on the leader)",
            voters.len()
        )));
    }
    Ok(target)
}

/// Waits until `target`'s replication has matched the leader's last log entry.
async fn await_caught_up(
    node: &Node,
    to: u64,
    target: u64,
    deadline: Instant,
    timeout: Duration,
) -> Result<(), ConsensusError> {
    let matched = |m: &Metrics| {
        let progress = m.replication.as_ref()?.get(&target).copied().flatten();
        progress.map(|log| log.index)
    };
    let mut metrics = node.metrics.clone();
    let caught_up =
        metrics.wait_for(|m| m.state != ServerState::Leader || matched(m) == m.last_log_index);
    let caught_up = tokio::time::timeout_at(deadline, caught_up)
        .await
        .map(|seen| seen.map(|m| (m.state, m.current_leader)));
    match caught_up {
        Ok(Ok((ServerState::Leader, _))) => Ok(()),
        Ok(Ok((_, leader))) => Err(ConsensusError::NotLeader {
            leader: leader.map(member_of),
        }),
        Ok(Err(_)) => Err(ConsensusError::Raft("the consensus node stopped".into())),
        Err(_) => {
            let m = node.metrics.borrow();
            Err(ConsensusError::Transfer(format!(
                "member {to} has not matched the leader's log within {timeout:?} (index {:?} of {:?})",
                matched(&m),
                m.last_log_index
            )))
        }
    }
}

impl Inner {
    /// Waits until this member has led for longer than the leader lease, when it grants a
    /// candidate its vote; refused at once if that is past `deadline`.
    async fn await_lease_passed(
        &self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), ConsensusError> {
        let lease = Duration::from_millis(self.raft_config.election_timeout_max);
        // Not seen leading yet: it has just been elected.
        let since = lock(&self.leading_since).map_or_else(Instant::now, |(_, at)| at);
        let ready = since + lease + LEASE_SLACK;
        if ready > deadline {
            return Err(ConsensusError::Transfer(format!(
                "this member has led for {:?}; no voter grants another its vote before the \
                 leader lease ({lease:?}) has passed, which is beyond the {timeout:?} bound",
                since.elapsed()
            )));
        }
        tokio::time::sleep_until(ready).await;
        Ok(())
    }

    /// The receiving side of "elect": this member's node `node`, a voter, campaigns at once.
    pub(crate) async fn campaign(&self, node: u64) -> Result<(), ConsensusError> {
        let mine = self.node.get().ok_or(ConsensusError::NotJoined)?;
        if node != mine.id {
            return Err(ConsensusError::WrongNode {
                to: node,
                node: mine.id,
            });
        }
        if !mine.is_voter() {
            return Err(ConsensusError::Transfer(format!(
                "raft node {node} is not a voter"
            )));
        }
        tracing::info!(node, "consensus: asked by the leader to campaign");
        mine.raft
            .trigger()
            .elect()
            .await
            .map_err(|e| ConsensusError::Raft(e.to_string()))
    }
}
