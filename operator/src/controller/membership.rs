//! Membership changes of replicated broker groups when `spec.replication.replicas` changes, and
//! the handover before a member's pod is deleted. Pure: the plan turns the answers into steps.
//!
//! Scale up: the StatefulSet starts the new pods (each with spec's member list and an empty
//! directory), then each is added (`add`, lowest id first) once it answers. Scale down: each
//! member past spec's size is removed (`remove`, highest id first), the master switched away
//! first; its pod stays until its removal is done ([`kept_pods`]). One change per pass.

use super::replication::GroupObservation;
use crate::crd::Broker;
use crate::desired;

/// The next membership change of one group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberStep {
    /// Add replica `0` (its pod runs and answered).
    Add(u64),
    /// Remove replica `0` (not the master).
    Remove(u64),
    /// Hand mastership from `master` to `target` before `master` is removed.
    Switchover { master: u64, target: u64 },
    /// A change is due but cannot be made yet: why.
    Wait(String),
    /// The membership is spec's (or unknown: no member answered).
    Done,
}

/// The next change that brings the group's membership to replica ids `0..size`: adds first
/// (the group never has fewer copies than before), then removals. `running(id)`: replica
/// `id`'s pod exists and is not being deleted.
pub fn next_member_step(
    size: u64,
    observation: &GroupObservation,
    running: impl Fn(u64) -> bool,
) -> MemberStep {
    let (Some(status), Some(members)) = (&observation.status, observation.membership()) else {
        return MemberStep::Done;
    };
    let missing = (0..size).find(|id| !members.contains(id));
    let extra = members.iter().rev().copied().find(|id| *id >= size);
    if missing.is_none() && extra.is_none() {
        return MemberStep::Done;
    }
    let Some(master) = status.master_id else {
        return MemberStep::Wait(format!("the group has no master (epoch {})", status.epoch));
    };
    if !observation.master_answered() {
        return MemberStep::Wait(format!("the master, replica {master}, did not answer"));
    }
    if let Some(id) = missing {
        let started = running(id) && observation.answered.contains(&id);
        return if started {
            MemberStep::Add(id)
        } else {
            MemberStep::Wait(format!("replica {id} is starting"))
        };
    }
    let Some(id) = extra else {
        return MemberStep::Done;
    };
    if id != master {
        return MemberStep::Remove(id);
    }
    let target = status
        .in_sync_replicas
        .iter()
        .copied()
        .filter(|replica| *replica < size && *replica != master)
        .min();
    match target {
        Some(target) => MemberStep::Switchover { master, target },
        None => MemberStep::Wait(format!(
            "no in-sync replica to hand mastership to before removing replica {master}"
        )),
    }
}

/// Pods the StatefulSet keeps: past spec's pods, those of the last group's members still to be
/// removed (never more than `existing`, so a removed member's pod is not recreated).
pub fn kept_pods(broker: &Broker, groups: &[GroupObservation], existing: i32) -> i32 {
    let wanted = desired::pods_of_groups(broker, broker.spec.replicas.max(1));
    let last = desired::groups_of_pods(broker, wanted) - 1;
    let first = desired::group_ordinals(broker, last).start;
    let highest_member = groups
        .iter()
        .find(|group| group.group == last)
        .and_then(GroupObservation::membership)
        .and_then(|members| members.last().copied())
        .and_then(|id| i32::try_from(id).ok());
    match highest_member {
        Some(id) => wanted.max((first + id + 1).min(existing)),
        None => wanted,
    }
}

/// What deleting the pod of a group member needs first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BeforeDelete {
    /// Not the master (or nothing is known of the group): delete it.
    Delete,
    /// The master: hand mastership to `target` first, delete on a later pass.
    Switchover { master: u64, target: u64 },
    /// The master, but no switchover can come first, so deleting it is an election: why.
    Election(String),
}

/// Whether replica `id`'s pod may be deleted now: a master hands over to an in-sync replica
/// whose pod is up (`up(id)`) first; a master that did not answer, or has no such replica,
/// is deleted anyway (the group elects, as it would on the pod's own failure).
pub fn before_delete(
    observation: &GroupObservation,
    id: u64,
    up: impl Fn(u64) -> bool,
) -> BeforeDelete {
    let Some(status) = &observation.status else {
        return BeforeDelete::Delete;
    };
    if status.master_id != Some(id) {
        return BeforeDelete::Delete;
    }
    if !observation.master_answered() {
        return BeforeDelete::Election(format!(
            "it is the master of {} and does not answer, so the group elects a new one",
            observation.name
        ));
    }
    let target = status
        .in_sync_replicas
        .iter()
        .copied()
        .filter(|replica| *replica != id && up(*replica))
        .min();
    match target {
        Some(target) => BeforeDelete::Switchover { master: id, target },
        None => BeforeDelete::Election(format!(
            "it is the master of {} and no in-sync replica can take over, so the group \
             elects a new master once a member is back",
            observation.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::{ReplicaRole, ReplicaStatus};
    use crate::fixtures::BrokerFixture;
    use quiver_client::admin::standalone_status;

    /// Group 0 with `members`, `master` (answering itself unless `silent`), `in_sync`, and the
    /// brokers `answered`.
    fn group(members: &[u64], master: u64, in_sync: &[u64], answered: &[u64]) -> GroupObservation {
        let mut status = standalone_status("qb-g0", "qb-0.qb-headless.ns.svc:10911");
        status.replica_id = answered.first().copied().unwrap_or(master);
        status.master_id = Some(master);
        status.in_sync_replicas = in_sync.to_vec();
        status.replicas = members
            .iter()
            .map(|&id| ReplicaStatus {
                replica_id: id,
                address: format!("qb-{id}.qb-headless.ns.svc:10911"),
                role: if id == master {
                    ReplicaRole::Master
                } else {
                    ReplicaRole::Replica
                },
                in_sync: in_sync.contains(&id),
                log_end: 0,
                lag_bytes: 0,
                lag_ms: 0,
            })
            .collect();
        GroupObservation {
            group: 0,
            name: "qb-g0".into(),
            status: Some(status),
            answered: answered.to_vec(),
        }
    }

    #[test]
    fn a_new_member_is_added_once_its_pod_runs_and_answers() {
        let all = |_: u64| true;
        let rows = [
            (
                "nothing to change",
                2,
                group(&[0, 1], 0, &[0, 1], &[0, 1]),
                MemberStep::Done,
            ),
            (
                "the new pod has not answered",
                3,
                group(&[0, 1], 0, &[0, 1], &[0, 1]),
                MemberStep::Wait("replica 2 is starting".into()),
            ),
            (
                "it answered",
                3,
                group(&[0, 1], 0, &[0, 1], &[0, 1, 2]),
                MemberStep::Add(2),
            ),
            (
                "lowest first",
                4,
                group(&[0, 1], 0, &[0, 1], &[0, 1, 2, 3]),
                MemberStep::Add(2),
            ),
            (
                "the master did not answer",
                3,
                group(&[0, 1], 0, &[0, 1], &[1, 2]),
                MemberStep::Wait("the master, replica 0, did not answer".into()),
            ),
        ];
        for (name, size, observation, step) in rows {
            assert_eq!(next_member_step(size, &observation, all), step, "{name}");
        }
        let answered = group(&[0, 1], 0, &[0, 1], &[0, 1, 2]);
        assert_eq!(
            next_member_step(3, &answered, |id| id != 2),
            MemberStep::Wait("replica 2 is starting".into()),
            "its pod is being deleted"
        );
    }

    #[test]
    fn a_member_past_the_size_is_removed_the_master_switched_away_first() {
        let all = |_: u64| true;
        let rows = [
            (
                "a replica",
                2,
                group(&[0, 1, 2], 0, &[0, 1, 2], &[0]),
                MemberStep::Remove(2),
            ),
            (
                "highest first",
                1,
                group(&[0, 1, 2], 0, &[0, 1, 2], &[0]),
                MemberStep::Remove(2),
            ),
            (
                "the master goes to the lowest kept in-sync replica",
                2,
                group(&[0, 1, 2], 2, &[0, 1, 2], &[2]),
                MemberStep::Switchover {
                    master: 2,
                    target: 0,
                },
            ),
            (
                "no kept replica in sync",
                2,
                group(&[0, 1, 2], 2, &[2], &[2]),
                MemberStep::Wait(
                    "no in-sync replica to hand mastership to before removing replica 2".into(),
                ),
            ),
        ];
        for (name, size, observation, step) in rows {
            assert_eq!(next_member_step(size, &observation, all), step, "{name}");
        }
        let mut silent = group(&[0, 1], 0, &[0, 1], &[]);
        silent.status = None;
        assert_eq!(next_member_step(3, &silent, all), MemberStep::Done);
    }

    #[test]
    fn pods_of_members_still_to_remove_are_kept_but_never_recreated() {
        let broker = Broker::test().replicas(1).replicated(2, 1);
        let removing = [group(&[0, 1, 2], 0, &[0, 1, 2], &[0])];
        assert_eq!(kept_pods(&broker, &removing, 3), 3);
        assert_eq!(kept_pods(&broker, &removing, 2), 2, "not recreated");
        let removed = [group(&[0, 1], 0, &[0, 1], &[0])];
        assert_eq!(kept_pods(&broker, &removed, 3), 2);
        let grown = Broker::test().replicas(1).replicated(3, 1);
        assert_eq!(kept_pods(&grown, &removed, 2), 3);
    }

    #[test]
    fn a_master_hands_over_before_its_pod_is_deleted_or_it_is_an_election() {
        let all = |_: u64| true;
        let master_answers = group(&[0, 1, 2], 0, &[0, 1, 2], &[0, 1, 2]);
        assert_eq!(before_delete(&master_answers, 1, all), BeforeDelete::Delete);
        assert_eq!(
            before_delete(&master_answers, 0, all),
            BeforeDelete::Switchover {
                master: 0,
                target: 1
            }
        );
        assert_eq!(
            before_delete(&master_answers, 0, |id| id != 1),
            BeforeDelete::Switchover {
                master: 0,
                target: 2
            },
            "a replica whose pod is down cannot take over"
        );
        let alone = group(&[0, 1, 2], 0, &[0], &[0, 1, 2]);
        assert!(matches!(
            before_delete(&alone, 0, all),
            BeforeDelete::Election(why) if why.contains("no in-sync replica")
        ));
        let silent_master = group(&[0, 1, 2], 0, &[0, 1, 2], &[1, 2]);
        assert!(matches!(
            before_delete(&silent_master, 0, all),
            BeforeDelete::Election(why) if why.contains("does not answer")
        ));
    }
}
