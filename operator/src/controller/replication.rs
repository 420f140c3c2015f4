//! Replicated broker groups: each group's status from its members (QUIVER_REPLICATION_STATUS),
//! the ReplicationDegraded condition, and the switchover step of a group's rollout (the rollout
//! order is [`super::rollout::next_group_step`]'s). Only [`observe`] calls the brokers; the
//! rest is pure.

use super::broker::{Note, Step};
use super::conditions::Desired;
use super::Context;
use crate::admin::{BrokerAddr, ReplicaRole, ReplicationStatus};
use crate::crd::{Broker, ReplicaMemberStatus, ReplicationGroupStatus};
use crate::desired;
use kube::runtime::events::EventType;
use std::collections::BTreeSet;
use std::time::Duration;

/// Condition type: a replicated group is below its minimum in sync, or has no master.
pub const CONDITION: &str = "ReplicationDegraded";
/// ReplicationDegraded reason: a group's in-sync set is smaller than minInSyncReplicas.
pub const REASON_BELOW_MIN: &str = "BelowMinInSync";
/// ReplicationDegraded reason: a group has no master.
pub const REASON_NO_MASTER: &str = "NoMaster";
/// ReplicationDegraded reason (Unknown): no member of a group answered.
pub const REASON_UNKNOWN: &str = "ReplicationStatusUnknown";
/// ReplicationDegraded reason (False): every group has a master and its minimum in sync.
pub const REASON_IN_SYNC: &str = "InSync";
/// Degraded reason: a rollout step (pod deletion, switchover) failed.
pub const REASON_ROLLOUT_STEP: &str = "ReplicatedRolloutStepFailed";
/// How long a master may pause sends while the switchover's target catches up.
pub const SWITCHOVER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a membership change may take, a new member's catch-up included; one that takes
/// longer fails and is asked again on a later pass.
pub const MEMBERSHIP_TIMEOUT: Duration = Duration::from_secs(60);

/// One group as its members answered.
#[derive(Clone, Debug, PartialEq)]
pub struct GroupObservation {
    /// Group index.
    pub group: i32,
    /// The group's broker name.
    pub name: String,
    /// The group as the answer of the newest epoch sees it (the master's own at that epoch
    /// first, [`best_view`]); None when no member answered.
    pub status: Option<ReplicationStatus>,
    /// Replica ids of the brokers that answered for the group, members or joining.
    pub answered: Vec<u64>,
}

impl GroupObservation {
    /// The group's membership (replica ids), as the trusted view lists it.
    pub fn membership(&self) -> Option<BTreeSet<u64>> {
        let status = self.status.as_ref()?;
        Some(status.replicas.iter().map(|r| r.replica_id).collect())
    }

    /// Whether the master answered itself (the trusted view is its own).
    pub fn master_answered(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|status| status.master_id == Some(status.replica_id))
    }
}

/// Asks the brokers of `groups` groups, among the first `pods` pods, for their replication
/// status, all at once; never fails (a member that does not answer is left out). The last
/// group is also asked on the pods past its size: a replicas decrease keeps members there
/// until they are removed. An answer counts for a group only under the group's broker name.
pub async fn observe(
    broker: &Broker,
    groups: i32,
    pods: i32,
    ctx: &Context,
) -> Vec<GroupObservation> {
    let asks = (0..groups).map(|group| async move {
        let name = desired::group_name(broker, group);
        let ordinals = desired::group_ordinals(broker, group);
        let end = if group + 1 == groups {
            ordinals.end.max(pods)
        } else {
            ordinals.end
        };
        let answers =
            (ordinals.start..end)
                .filter(|ordinal| *ordinal < pods)
                .map(|ordinal| async move {
                    let addr = BrokerAddr(desired::broker_address(broker, ordinal));
                    match ctx.admin.replication_status(&addr).await {
                        Ok(status) => Some(status),
                        Err(error) => {
                            tracing::debug!(broker = %addr, %error, "no replication status");
                            None
                        }
                    }
                });
        let answers: Vec<ReplicationStatus> = futures::future::join_all(answers)
            .await
            .into_iter()
            .flatten()
            .filter(|status| status.broker_name == name)
            .collect();
        let answered = answers.iter().map(|status| status.replica_id).collect();
        GroupObservation {
            group,
            name,
            status: best_view(answers),
            answered,
        }
    });
    futures::future::join_all(asks).await
}

/// The view to trust: the newest epoch's, its master's own answer first. A deposed master
/// that has not heard of the newer epoch still claims to be master: its older epoch loses.
pub fn best_view(answers: Vec<ReplicationStatus>) -> Option<ReplicationStatus> {
    answers.into_iter().max_by_key(|status| {
        let own_master = status.master_id == Some(status.replica_id);
        (status.epoch, own_master)
    })
}

/// Pod name of replica `id` of group `group`.
fn member_pod(broker: &Broker, group: i32, id: u64) -> String {
    let first = desired::group_ordinals(broker, group).start;
    let offset = i32::try_from(id).unwrap_or(i32::MAX - first);
    desired::pod_name(broker, first + offset)
}

/// The status entry of one group, pure.
pub fn group_status(broker: &Broker, observation: &GroupObservation) -> ReplicationGroupStatus {
    let group = observation.group;
    let Some(status) = &observation.status else {
        let members = desired::group_ordinals(broker, group)
            .map(|ordinal| ReplicaMemberStatus {
                replica_id: u64::try_from(desired::group_of(broker, ordinal).1).unwrap_or(0),
                pod: desired::pod_name(broker, ordinal),
                role: "Unreachable".to_string(),
                in_sync: false,
                lag_bytes: None,
            })
            .collect();
        return ReplicationGroupStatus {
            name: observation.name.clone(),
            members,
            ..ReplicationGroupStatus::default()
        };
    };
    let members = (0..u64::try_from(broker.group_size()).unwrap_or(1))
        .map(|id| {
            let reported = status.replicas.iter().find(|r| r.replica_id == id);
            ReplicaMemberStatus {
                replica_id: id,
                pod: member_pod(broker, group, id),
                role: match reported.map(|r| r.role) {
                    Some(ReplicaRole::Master) => "Master",
                    Some(ReplicaRole::Replica) => "Replica",
                    Some(ReplicaRole::Unknown) => "Unknown",
                    None => "Unreachable",
                }
                .to_string(),
                in_sync: status.in_sync_replicas.contains(&id),
                lag_bytes: reported.map(|r| r.lag_bytes),
            }
        })
        .collect();
    ReplicationGroupStatus {
        name: observation.name.clone(),
        epoch: Some(status.epoch),
        master: status
            .master_id
            .map(|master| member_pod(broker, group, master)),
        in_sync: status
            .in_sync_replicas
            .iter()
            .map(|id| member_pod(broker, group, *id))
            .collect(),
        members,
    }
}

/// The ReplicationDegraded condition over every group, pure: True (NoMaster, BelowMinInSync)
/// naming each group and what it lacks; Unknown when a group did not answer and none is
/// degraded; else False.
pub fn condition(broker: &Broker, groups: &[ReplicationGroupStatus]) -> Desired {
    let min = broker
        .spec
        .replication
        .as_ref()
        .map_or(1, |replication| replication.min_in_sync_replicas.max(1));
    let min = usize::try_from(min).unwrap_or(1);
    let mut no_master = Vec::new();
    let mut below = Vec::new();
    let mut unknown = Vec::new();
    for group in groups {
        if group.epoch.is_none() {
            unknown.push(group.name.clone());
            continue;
        }
        if group.master.is_none() {
            no_master.push(format!(
                "{} has no master (epoch {})",
                group.name,
                group.epoch.unwrap_or(0)
            ));
        }
        if group.in_sync.len() < min {
            below.push(format!(
                "{} has {} in sync ({}), below minInSyncReplicas {min}",
                group.name,
                group.in_sync.len(),
                if group.in_sync.is_empty() {
                    "none".to_string()
                } else {
                    group.in_sync.join(", ")
                }
            ));
        }
    }
    if !no_master.is_empty() || !below.is_empty() {
        let reason = if no_master.is_empty() {
            REASON_BELOW_MIN
        } else {
            REASON_NO_MASTER
        };
        let mut message: Vec<String> = no_master.into_iter().chain(below).collect();
        message.push("such a group refuses sends until enough members are back in sync".into());
        return Desired::new(CONDITION, true, reason, message.join("; "));
    }
    if !unknown.is_empty() {
        let message = format!("no member of {} answered", unknown.join(", "));
        return Desired::new(
            CONDITION,
            super::conditions::Status::Unknown,
            REASON_UNKNOWN,
            message,
        );
    }
    Desired::new(
        CONDITION,
        false,
        REASON_IN_SYNC,
        format!(
            "every group has a master and at least {min} member{} in sync",
            if min == 1 { "" } else { "s" }
        ),
    )
}

/// The step that hands group `observation`'s mastership from replica `master` to `target`,
/// asked of the master's address (as the group reported it, else the master pod's), before
/// `before` ("restarting", "deleting", "removing") the old master.
pub fn switchover_step(
    broker: &Broker,
    observation: &GroupObservation,
    master: u64,
    target: u64,
    before: &str,
) -> Step {
    let from = member_pod(broker, observation.group, master);
    let to = member_pod(broker, observation.group, target);
    let addr = observation
        .status
        .as_ref()
        .and_then(|status| status.master_address.clone())
        .unwrap_or_else(|| {
            let first = desired::group_ordinals(broker, observation.group).start;
            let offset = i32::try_from(master).unwrap_or_default();
            desired::broker_address(broker, first + offset)
        });
    Step::Switchover {
        addr: BrokerAddr(addr),
        target,
        done: Note {
            type_: EventType::Normal,
            reason: "Switchover",
            action: "Rollout",
            note: format!(
                "{}: mastership moved from {from} to {to} before {before} {from}",
                observation.name
            ),
        },
        failed: (
            REASON_ROLLOUT_STEP,
            format!(
                "switchover of {} from {from} to {to} failed",
                observation.name
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::conditions::Status;
    use crate::fixtures::BrokerFixture;
    use quiver_client::admin::standalone_status;

    fn three() -> Broker {
        Broker::test().replicas(2).replicated(3, 2)
    }

    fn observed(group: i32, master: Option<u64>, in_sync: &[u64]) -> GroupObservation {
        let mut status = standalone_status("qb-g1", "qb-3.qb-headless.ns.svc:10911");
        status.master_id = master;
        status.epoch = 5;
        status.in_sync_replicas = in_sync.to_vec();
        status.replicas = (0..3)
            .map(|id| crate::admin::ReplicaStatus {
                replica_id: id,
                address: format!("qb-{}.qb-headless.ns.svc:10911", 3 + id),
                role: if Some(id) == master {
                    ReplicaRole::Master
                } else {
                    ReplicaRole::Replica
                },
                in_sync: in_sync.contains(&id),
                log_end: 100,
                lag_bytes: if in_sync.contains(&id) { 0 } else { 40 },
                lag_ms: 0,
            })
            .collect();
        GroupObservation {
            group,
            name: format!("qb-g{group}"),
            status: Some(status),
            answered: vec![0, 1, 2],
        }
    }

    #[test]
    fn the_group_status_names_pods_roles_and_lag() {
        let status = group_status(&three(), &observed(1, Some(1), &[0, 1]));
        assert_eq!(status.name, "qb-g1");
        assert_eq!(status.epoch, Some(5));
        assert_eq!(status.master.as_deref(), Some("qb-4"));
        assert_eq!(status.in_sync, ["qb-3", "qb-4"]);
        let members: Vec<(u64, &str, &str, bool, Option<u64>)> = status
            .members
            .iter()
            .map(|m| {
                (
                    m.replica_id,
                    m.pod.as_str(),
                    m.role.as_str(),
                    m.in_sync,
                    m.lag_bytes,
                )
            })
            .collect();
        assert_eq!(
            members,
            [
                (0, "qb-3", "Replica", true, Some(0)),
                (1, "qb-4", "Master", true, Some(0)),
                (2, "qb-5", "Replica", false, Some(40)),
            ]
        );
        let silent = GroupObservation {
            group: 0,
            name: "qb-g0".into(),
            status: None,
            answered: Vec::new(),
        };
        let status = group_status(&three(), &silent);
        assert_eq!(status.epoch, None);
        assert!(status.members.iter().all(|m| m.role == "Unreachable"));
        assert_eq!(status.members[2].pod, "qb-2");
    }

    #[test]
    fn the_condition_says_which_group_lacks_what() {
        let broker = three();
        let healthy = [
            group_status(&broker, &observed(0, Some(0), &[0, 1, 2])),
            group_status(&broker, &observed(1, Some(1), &[0, 1])),
        ];
        let ok = condition(&broker, &healthy);
        assert_eq!((ok.status, ok.reason), (Status::False, REASON_IN_SYNC));
        let below = [
            healthy[0].clone(),
            group_status(&broker, &observed(1, Some(1), &[1])),
        ];
        let degraded = condition(&broker, &below);
        assert_eq!(
            (degraded.status, degraded.reason),
            (Status::True, REASON_BELOW_MIN)
        );
        assert!(
            degraded
                .message
                .starts_with("qb-g1 has 1 in sync (qb-4), below minInSyncReplicas 2"),
            "{}",
            degraded.message
        );
        let headless = [
            group_status(&broker, &observed(0, None, &[0, 1])),
            healthy[1].clone(),
        ];
        let no_master = condition(&broker, &headless);
        assert_eq!(
            (no_master.status, no_master.reason),
            (Status::True, REASON_NO_MASTER)
        );
        assert!(no_master.message.contains("qb-g0 has no master (epoch 5)"));
        let silent = [
            healthy[0].clone(),
            group_status(
                &broker,
                &GroupObservation {
                    group: 1,
                    name: "qb-g1".into(),
                    status: None,
                    answered: Vec::new(),
                },
            ),
        ];
        let unknown = condition(&broker, &silent);
        assert_eq!(
            (unknown.status, unknown.reason),
            (Status::Unknown, REASON_UNKNOWN)
        );
        assert_eq!(unknown.message, "no member of qb-g1 answered");
    }

    #[test]
    fn the_newest_epoch_wins_and_at_it_the_masters_own_view() {
        let view = |replica_id: u64, master: Option<u64>, epoch: u64| ReplicationStatus {
            replica_id,
            master_id: master,
            epoch,
            ..standalone_status("qb-g0", "a")
        };
        let picked = |answers: Vec<ReplicationStatus>| {
            best_view(answers).map(|s| (s.replica_id, s.master_id, s.epoch))
        };
        // Two claim master: the deposed one (epoch 1) has not heard of epoch 2, in either order.
        let deposed = view(0, Some(0), 1);
        let elected = view(1, Some(1), 2);
        assert_eq!(
            picked(vec![deposed.clone(), elected.clone(), view(2, Some(1), 2)]),
            Some((1, Some(1), 2))
        );
        assert_eq!(
            picked(vec![elected, deposed.clone()]),
            Some((1, Some(1), 2))
        );
        // A replica of a newer epoch names another master than the deposed one claiming it.
        assert_eq!(
            picked(vec![deposed, view(2, Some(2), 3)]),
            Some((2, Some(2), 3))
        );
        // At one epoch, the master's own answer is the one to trust.
        assert_eq!(
            picked(vec![
                view(0, Some(0), 8),
                view(1, Some(0), 8),
                view(2, Some(0), 8)
            ]),
            Some((0, Some(0), 8))
        );
        assert_eq!(
            picked(vec![view(1, Some(0), 4), view(2, Some(0), 6)]),
            Some((2, Some(0), 6))
        );
        assert_eq!(
            picked(vec![view(1, None, 3), view(2, None, 2)]),
            Some((1, None, 3))
        );
        assert_eq!(best_view(Vec::new()), None);
    }
}
