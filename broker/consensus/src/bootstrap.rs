//! A member whose directory is empty: probes the other members, then creates the
//! group, joins it as a founder, or rejoins it (README, "A member whose directory is
//! empty").

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use crate::inner::{lock, random_nonzero_u32, Inner, RETRY_MAX, RETRY_MIN};
use crate::messages::{ProbeReply, ProbeRequest};
use crate::network::KIND_PROBE;
use crate::rejoin::rejoin;
use crate::store::Identity;
use crate::{member_of, node_id, ConsensusError, Phase};

/// How many more probe rounds (RETRY_MIN apart) a member that may create the group
/// gives the members that did not answer.
const CREATE_GRACE_ROUNDS: u32 = 2;

impl Inner {
    pub(crate) fn probe_reply(&self) -> ProbeReply {
        let identity = lock(&self.identity).clone();
        let Some(identity) = identity else {
            return ProbeReply::Fresh { nonce: self.nonce };
        };
        let (mut voters, mut learners, mut leader) = (BTreeSet::new(), BTreeSet::new(), None);
        if let Some(node) = self.node.get() {
            let m = node.metrics.borrow();
            voters = m.membership_config.membership().voter_ids().collect();
            learners = m.membership_config.membership().learner_ids().collect();
            leader = m.current_leader.map(member_of);
        }
        ProbeReply::Member {
            node: node_id(identity.member, identity.incarnation),
            voters,
            learners,
            leader,
            founders: identity.founders,
        }
    }

    /// One round of probes of every other member; what to do next.
    async fn probe_round(&self) -> Decision {
        let body = serde_json::to_vec(&ProbeRequest {
            from: self.member,
            nonce: self.nonce,
        })
        .expect("a probe serializes");
        let mut calls = tokio::task::JoinSet::new();
        for (member, address) in self.configured.iter().filter(|(m, _)| **m != self.member) {
            let call = self
                .transport
                .call(*member, address, KIND_PROBE, body.clone());
            let (member, limit) = (*member, self.request_timeout);
            calls.spawn(async move {
                let answer = match tokio::time::timeout(limit, call).await {
                    Err(_) => Err(format!("no answer in {limit:?}")),
                    Ok(Err(e)) => Err(e.to_string()),
                    Ok(Ok(bytes)) => serde_json::from_slice::<ProbeReply>(&bytes)
                        .map_err(|e| format!("unreadable answer: {e}")),
                };
                (member, answer)
            });
        }
        let mut fresh = BTreeMap::from([(self.member, self.nonce)]);
        let mut existing = Vec::new();
        let mut silent = Vec::new();
        while let Some(joined) = calls.join_next().await {
            let Ok((member, answer)) = joined else {
                continue;
            };
            match answer {
                Ok(ProbeReply::Fresh { nonce }) => {
                    fresh.insert(member, nonce);
                }
                Ok(ProbeReply::Member {
                    node,
                    leader,
                    founders,
                    ..
                }) => existing.push((member, node, leader, founders)),
                Err(e) => silent.push(format!("{member}: {e}")),
            }
        }
        // A group created counting this very start as uninitialized: this member
        // has taken no Raft message since, so its incarnation 0 never had state.
        if let Some((_, _, _, founders)) = existing
            .iter()
            .find(|(_, _, _, f)| f.get(&self.member) == Some(&self.nonce))
        {
            return Decision::Found(founders.clone());
        }
        if let Some((member, node, leader, _)) = existing.first() {
            let leader = existing.iter().find_map(|(_, _, l, _)| *l).or(*leader);
            return Decision::Rejoin {
                why: format!("member {member} is raft node {node} of the group"),
                leader,
            };
        }
        let needed = self.configured.len() / 2 + 1;
        if fresh.len() >= needed {
            return Decision::Create {
                founders: fresh,
                silent,
            };
        }
        Decision::Wait(format!(
            "{} of {} members known to have no consensus state ({:?}), {} needed to create the group, \
             and none answered that it exists; no answer from [{}]",
            fresh.len(),
            self.configured.len(),
            fresh.keys().collect::<Vec<_>>(),
            needed,
            silent.join("; ")
        ))
    }

    /// Records who this member is (durably, before its node runs).
    async fn decide(&self, identity: Identity) -> Result<(), ConsensusError> {
        *lock(&self.identity) = Some(identity.clone());
        let dir = self.dir.clone();
        tokio::task::spawn_blocking(move || identity.write(&dir))
            .await
            .map_err(std::io::Error::other)??;
        Ok(())
    }
}

enum Decision {
    /// Another member created a brand-new group counting this start: initialize it too.
    Found(BTreeMap<u64, u64>),
    /// A majority is known to be uninitialized: create the group (`silent`: the
    /// members that did not answer).
    Create {
        founders: BTreeMap<u64, u64>,
        silent: Vec<String>,
    },
    /// The group exists: rejoin it under a new node id.
    Rejoin { why: String, leader: Option<u64> },
    /// Not enough answers to know.
    Wait(String),
}

/// A member with an empty directory: finds out whether its group exists, then
/// creates it, joins it as a founder, or rejoins it.
pub(crate) async fn bootstrap(inner: Arc<Inner>) {
    let mut backoff = RETRY_MIN;
    let mut round: u64 = 0;
    let mut grace = 0;
    loop {
        round += 1;
        let (identity, leader) = match inner.probe_round().await {
            Decision::Wait(why) => {
                inner.report_wait(round, backoff, why);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RETRY_MAX);
                continue;
            }
            Decision::Create { silent, .. }
                if !silent.is_empty() && grace < CREATE_GRACE_ROUNDS =>
            {
                // Members starting at about the same time are counted too (then they
                // are voters from the start instead of rejoining).
                grace += 1;
                tracing::info!(
                    id = inner.member,
                    round,
                    "consensus: a majority of the members has no consensus state; \
                    waiting briefly for the others to answer: [{}]",
                    silent.join("; ")
                );
                tokio::time::sleep(RETRY_MIN).await;
                continue;
            }
            Decision::Create { founders, .. } => {
                tracing::info!(id = inner.member, founders = ?founders.keys().collect::<Vec<_>>(),
                    "consensus: a majority of the members has no consensus state: creating the group");
                (inner.founder(founders), None)
            }
            Decision::Found(founders) => {
                tracing::info!(id = inner.member, founders = ?founders.keys().collect::<Vec<_>>(),
                    "consensus: the group was created counting this member: joining it");
                (inner.founder(founders), None)
            }
            Decision::Rejoin { why, leader } => (inner.rejoiner(&why), Some(leader)),
        };
        if !become_node(inner.clone(), identity, leader).await {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RETRY_MAX);
            continue;
        }
        return;
    }
}

impl Inner {
    /// Says why the group is not created yet: the first rounds, whenever the
    /// reason changes, then now and then.
    fn report_wait(&self, round: u64, backoff: Duration, why: String) {
        let said = lock(&self.phase).1.clone();
        if round <= 3 || said.as_ref() != Some(&why) || round % 30 == 0 {
            tracing::warn!(
                id = self.member,
                round,
                retry_in = ?backoff,
                "consensus: not creating the group: {why}"
            );
        }
        self.set_phase(Phase::Probing, Some(why));
    }

    /// The identity of a founder of a brand-new group.
    fn founder(&self, founders: BTreeMap<u64, u64>) -> Identity {
        Identity {
            member: self.member,
            incarnation: 0,
            founders,
        }
    }

    /// A new identity (a random incarnation) to rejoin the existing group under.
    fn rejoiner(&self, why: &str) -> Identity {
        let identity = Identity {
            member: self.member,
            incarnation: random_nonzero_u32(),
            founders: BTreeMap::new(),
        };
        tracing::warn!(
            id = self.member,
            node = node_id(self.member, identity.incarnation),
            "consensus: this member has no consensus state but the group exists ({why}): \
             rejoining under a new raft node id, as a learner until the leader promotes it"
        );
        identity
    }
}

/// Records `identity` and starts its node: initializes the brand-new group
/// (`leader` None) or rejoins the existing one (`leader`: the leader a probe
/// named, if any). False when the identity could not be recorded: nothing ran
/// as that node yet, so the caller probes and decides again.
async fn become_node(inner: Arc<Inner>, identity: Identity, leader: Option<Option<u64>>) -> bool {
    let node = node_id(inner.member, identity.incarnation);
    let incarnation = identity.incarnation;
    if let Err(e) = inner.decide(identity).await {
        tracing::error!(id = inner.member, error = %e, "consensus: cannot record this member's identity");
        *lock(&inner.identity) = None;
        inner.set_phase(
            Phase::Probing,
            Some(format!("cannot record the identity: {e}")),
        );
        return false;
    }
    if let Err(e) = inner.create_node(node).await {
        tracing::error!(id = inner.member, node, error = %e, "consensus: cannot start the raft node");
        inner.set_phase(
            Phase::Probing,
            Some(format!("cannot start the raft node: {e}")),
        );
        return true;
    }
    match leader {
        None => {
            debug_assert_eq!(incarnation, 0);
            if let Err(e) = inner.initialize().await {
                tracing::error!(id = inner.member, error = %e, "consensus: cannot initialize the group");
                inner.set_phase(Phase::Member, Some(format!("cannot initialize: {e}")));
                return true;
            }
            inner.set_phase(Phase::Member, None);
        }
        Some(leader) => {
            inner.set_phase(Phase::Rejoining, None);
            rejoin(inner, leader).await;
        }
    }
    true
}
