//! Rejoining: the member asking the leader to make its new Raft node a voter,
//! and the leader adding it as a learner and promoting it once caught up.

use std::collections::BTreeSet;
use std::sync::Arc;

use openraft::{BasicNode, ChangeMembers, ServerState};

use crate::inner::{lock, Inner, RETRY_MAX, RETRY_MIN};
use crate::messages::{RejoinReply, RejoinRequest};
use crate::network::KIND_REJOIN;
use crate::{incarnation_of, member_of, Phase};

impl Inner {
    /// On the leader: a rejoining member's request to make `req.node` a voter in
    /// place of its old node. Answers at once; the change runs in the background,
    /// one member at a time.
    pub(crate) fn handle_rejoin(self: &Arc<Self>, req: RejoinRequest) -> RejoinReply {
        let Some(node) = self.node.get() else {
            return RejoinReply::NotLeader { leader: None };
        };
        let (leads, leader, uniform_voter) = {
            let m = node.metrics.borrow();
            let configs = m.membership_config.membership().get_joint_config();
            (
                m.state == ServerState::Leader && m.current_leader == Some(node.id),
                m.current_leader.map(member_of),
                configs.len() == 1 && configs[0].contains(&req.node),
            )
        };
        if !leads {
            return RejoinReply::NotLeader { leader };
        }
        let known = self.members.borrow().contains_key(&req.member)
            || lock(&self.admitted).contains_key(&req.member);
        if !known {
            return RejoinReply::Refused(format!(
                "member {} is not a member of the group (members: {:?}); add it to the \
                 membership first (quiver replication members add)",
                req.member,
                self.members.borrow().keys().collect::<Vec<_>>()
            ));
        }
        if member_of(req.node) != req.member
            || incarnation_of(req.node) == 0
            || req.member == self.member
        {
            return RejoinReply::Refused(format!(
                "member {} cannot rejoin as raft node {}",
                req.member, req.node
            ));
        }
        if uniform_voter {
            return RejoinReply::Done;
        }
        let mut rejoining = lock(&self.rejoining);
        match *rejoining {
            Some(current) if current == (req.member, req.node) => RejoinReply::InProgress,
            Some((member, _)) => RejoinReply::Busy { member },
            None => {
                *rejoining = Some((req.member, req.node));
                drop(rejoining);
                tracing::info!(
                    member = req.member,
                    node = req.node,
                    "consensus: a member that lost its state rejoins: adding its new node as a learner"
                );
                let task = tokio::spawn(promote(self.clone(), req.member, req.node));
                self.track(task);
                RejoinReply::InProgress
            }
        }
    }

    /// On the leader: adds `node` as a learner, waits until it has caught up,
    /// then makes it a voter in place of `member`'s other nodes.
    async fn add_and_promote(&self, member: u64, node: u64) -> Result<(), String> {
        let raft = &self.node.get().expect("the leader's node").raft;
        let address = self.address(member).unwrap_or_default();
        let added = raft
            .add_learner(node, BasicNode::new(address), false)
            .await
            .map_err(|e| format!("adding the learner: {e}"))?;
        let target = added.log_id.index;
        let mut metrics = raft.metrics();
        let caught_up = metrics
            .wait_for(|m| {
                m.state != ServerState::Leader
                    || m.replication
                        .as_ref()
                        .and_then(|r| r.get(&node).copied().flatten())
                        .is_some_and(|matched| matched.index >= target)
            })
            .await
            .map(|m| m.state == ServerState::Leader)
            .unwrap_or(false);
        if !caught_up {
            return Err("no longer the leader".into());
        }
        let voters: BTreeSet<u64> = {
            let m = raft.metrics().borrow().clone();
            let configs = m.membership_config.membership().get_joint_config().clone();
            configs
                .last()
                .into_iter()
                .flatten()
                .copied()
                .filter(|v| member_of(*v) != member)
                .chain([node])
                .collect()
        };
        tracing::info!(
            member,
            node,
            ?voters,
            "consensus: the rejoining member caught up; making it a voter"
        );
        raft.change_membership(voters, false)
            .await
            .map_err(|e| format!("changing the membership: {e}"))?;
        Ok(())
    }
}

impl Inner {
    /// Asks member `target` (the leader, as far as this member knows) to make
    /// `node` a voter.
    async fn ask_rejoin(&self, target: u64, node: u64) -> Result<RejoinReply, String> {
        let address = self.address(target).unwrap_or_default();
        let body = serde_json::to_vec(&RejoinRequest {
            member: self.member,
            node,
        })
        .expect("a rejoin request serializes");
        let call = self.transport.call(target, &address, KIND_REJOIN, body);
        match tokio::time::timeout(self.request_timeout, call).await {
            Err(_) => Err(format!("no answer in {:?}", self.request_timeout)),
            Ok(Err(e)) => Err(e.to_string()),
            Ok(Ok(bytes)) => serde_json::from_slice::<RejoinReply>(&bytes)
                .map_err(|e| format!("unreadable answer: {e}")),
        }
    }
}

/// A rejoining member: asks the leader until its node is a voter.
pub(crate) async fn rejoin(inner: Arc<Inner>, mut hint: Option<u64>) {
    let node = inner.node.get().expect("the rejoining node");
    let others = inner.others();
    let mut next_other = 0usize;
    let mut backoff = RETRY_MIN;
    loop {
        if node.is_voter() {
            tracing::info!(
                id = inner.member,
                node = node.id,
                "consensus: rejoined the group as a voter"
            );
            inner.set_phase(Phase::Member, None);
            return;
        }
        let known = node.metrics.borrow().current_leader.map(member_of);
        let target = match known.or(hint.take()).filter(|m| *m != inner.member) {
            Some(m) => m,
            None if others.is_empty() => {
                inner.set_phase(Phase::Rejoining, Some("no other member".into()));
                return;
            }
            None => {
                next_other = (next_other + 1) % others.len();
                others[next_other]
            }
        };
        let why = match inner.ask_rejoin(target, node.id).await {
            Ok(RejoinReply::Done) => {
                backoff = RETRY_MIN;
                format!("member {target} (leader) made it a voter; waiting to learn it")
            }
            Ok(RejoinReply::InProgress) => {
                backoff = RETRY_MIN;
                format!("member {target} (leader) is catching it up as a learner")
            }
            Ok(RejoinReply::Busy { member }) => {
                format!("member {target} (leader) is rejoining member {member} first")
            }
            Ok(RejoinReply::NotLeader { leader }) => {
                hint = leader;
                format!("member {target} does not lead (leader: {leader:?})")
            }
            Ok(RejoinReply::Refused(why)) => {
                tracing::warn!(
                    id = inner.member,
                    target,
                    "consensus: rejoin refused: {why}"
                );
                format!("member {target} refused: {why}")
            }
            Err(e) => format!("member {target}: {e}"),
        };
        tracing::debug!(
            id = inner.member,
            node = node.id,
            "consensus: rejoining: {why}"
        );
        inner.set_phase(Phase::Rejoining, Some(why));
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RETRY_MAX);
    }
}

/// On the leader: rejoins `member` as `node` (bounded); on failure removes the
/// learner it added, so the member asks again.
async fn promote(inner: Arc<Inner>, member: u64, node: u64) {
    let result = tokio::time::timeout(inner.catch_up_timeout, inner.add_and_promote(member, node))
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "not caught up and promoted within {:?}",
                inner.catch_up_timeout
            ))
        });
    match result {
        Ok(()) => {
            tracing::info!(member, node, "consensus: the rejoining member is a voter")
        }
        Err(why) => {
            tracing::warn!(member, node, "consensus: rejoining failed: {why}");
            if let Some(own) = inner.node.get() {
                let only_learner = {
                    let m = own.metrics.borrow();
                    let learner = m
                        .membership_config
                        .membership()
                        .learner_ids()
                        .any(|l| l == node);
                    learner
                };
                if only_learner {
                    let removal = own.raft.change_membership(
                        ChangeMembers::RemoveNodes(BTreeSet::from([node])),
                        false,
                    );
                    match tokio::time::timeout(inner.request_timeout, removal).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(e)) => {
                            tracing::warn!(member, node, error = %e, "consensus: removing the learner")
                        }
                        Err(_) => tracing::warn!(
                            member,
                            node,
                            "consensus: removing the learner timed out"
                        ),
                    }
                }
            }
        }
    }
    *lock(&inner.rejoining) = None;
}
