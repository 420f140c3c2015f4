//! Rollouts: the partition plan, the progress deadline, the stuck pod to delete so the
//! StatefulSet can move on (an outdated pod that never becomes Ready blocks a rolling update
//! for good, kubernetes/kubernetes#67250), and a replicated group's next step, each group on
//! its own. The order is the operator's, whatever the StatefulSet's pod management (Parallel:
//! `desired::pod`'s docs). Pure: the reconciler reads and acts.

use crate::admin::ReplicationStatus;
use crate::crd::{Broker, BrokerStatus};
use crate::desired::{self, RolloutPlan, TEMPLATE_HASH_ANNOTATION};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;

/// Pod label the StatefulSet controller sets to the revision a pod runs.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// Where a rollout stands, from the existing StatefulSet and the new template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutPhase {
    /// No StatefulSet yet: everything is created at the new template.
    Creating,
    /// The template changed: start updating from the highest ordinal.
    Started,
    /// The pod at the old partition is updated and all pods are Ready: move down one.
    Stepped,
    /// Waiting for the pod at the current partition to be updated and Ready.
    Waiting,
    /// Every pod runs the current template.
    Complete,
}

/// The StatefulSet plan for this pass: pure, from the Broker, the existing StatefulSet and the
/// replica count decided by the drain, and the hash of the Secrets the pods mount.
pub fn plan_rollout(
    broker: &Broker,
    existing: Option<&StatefulSet>,
    replicas: i32,
    security_hash: Option<String>,
) -> (RolloutPlan, RolloutPhase) {
    let Some(existing) = existing else {
        return (
            RolloutPlan {
                replicas,
                security_hash,
                ..RolloutPlan::initial(broker)
            },
            RolloutPhase::Creating,
        );
    };
    let claim_size = claim_size(broker, existing);
    let current_partition = current_partition(existing);
    let provisional = RolloutPlan {
        replicas,
        partition: 0,
        claim_size,
        security_hash,
    };
    let new_hash = template_hash(&desired::stateful_set(broker, &provisional));
    if broker.is_replicated() {
        // OnDelete: no partition; the pods are restarted in [`next_group_step`]'s order.
        let phase = if template_hash(existing) != new_hash {
            RolloutPhase::Started
        } else {
            RolloutPhase::Complete
        };
        return (provisional, phase);
    }
    let last_ordinal = (replicas - 1).max(0);
    if template_hash(existing) != new_hash {
        return (
            RolloutPlan {
                partition: last_ordinal,
                ..provisional
            },
            RolloutPhase::Started,
        );
    }
    let partition = current_partition.min(last_ordinal);
    if partition == 0 {
        return (provisional, RolloutPhase::Complete);
    }
    let status = existing.status.clone().unwrap_or_default();
    let status_is_current = status.observed_generation.is_some()
        && status.observed_generation >= existing.metadata.generation;
    let updated = status.updated_replicas.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    if status_is_current && updated >= replicas - partition && ready >= replicas {
        (
            RolloutPlan {
                partition: partition - 1,
                ..provisional
            },
            RolloutPhase::Stepped,
        )
    } else {
        (
            RolloutPlan {
                partition,
                ..provisional
            },
            RolloutPhase::Waiting,
        )
    }
}

/// Whether the StatefulSet is at rest with `replicas` pods: its status is about the current
/// spec, and every pod exists, is Ready and runs the update revision.
pub fn is_settled(sts: &StatefulSet, replicas: i32) -> bool {
    let Some(status) = &sts.status else {
        return false;
    };
    let current = status.observed_generation.is_some()
        && status.observed_generation >= sts.metadata.generation;
    current
        && sts.spec.replicas == Some(replicas)
        && status.replicas == replicas
        && status.ready_replicas == Some(replicas)
        && status.updated_replicas == Some(replicas)
}

/// The size in the StatefulSet's volume claim template: volumeClaimTemplates are immutable, so
/// the plan keeps what the StatefulSet was created with.
fn claim_size(broker: &Broker, existing: &StatefulSet) -> String {
    existing
        .spec
        .volume_claim_templates
        .as_ref()
        .and_then(|claims| claims.first())
        .and_then(|claim| claim.spec.as_ref())
        .and_then(|claim| claim.resources.as_ref())
        .and_then(|resources| resources.requests.as_ref())
        .and_then(|requests| requests.get("storage"))
        .map(|quantity| quantity.0.clone())
        .unwrap_or_else(|| broker.spec.storage.size.clone())
}

pub fn template_hash(statefulset: &StatefulSet) -> Option<String> {
    statefulset
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|metadata| metadata.annotations.as_ref())
        .and_then(|annotations| annotations.get(TEMPLATE_HASH_ANNOTATION))
        .cloned()
}

/// What moves when a Broker makes progress: a new generation, a pod Ready, updated or added, a
/// partition step, a claim resized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgressMarkers {
    /// Generation the status describes.
    pub generation: Option<i64>,
    /// Ready pods.
    pub ready: i32,
    /// Pods running.
    pub replicas: i32,
    /// Rollout partition and updated pods, while rolling.
    pub rollout: Option<(i32, i32)>,
    /// Claims resized to spec.storage.size, once an expansion was asked for.
    pub resized_claims: Option<i32>,
}

impl ProgressMarkers {
    /// The markers a status recorded.
    pub fn of(status: &BrokerStatus) -> ProgressMarkers {
        ProgressMarkers {
            generation: status.observed_generation,
            ready: status.ready_replicas,
            replicas: status.current_replicas,
            rollout: status
                .rollout
                .as_ref()
                .map(|rollout| (rollout.partition, rollout.updated_replicas)),
            resized_claims: status
                .storage
                .as_ref()
                .map(|storage| storage.resized_claims),
        }
    }
}

/// When progress was last made: now if anything moved since `previous`, else what `previous`
/// recorded (now when it recorded nothing readable).
pub fn last_progress(
    previous: &BrokerStatus,
    now_markers: &ProgressMarkers,
    now: Timestamp,
) -> Timestamp {
    let recorded = previous
        .last_progress_time
        .as_deref()
        .and_then(|time| time.parse::<Timestamp>().ok());
    match recorded {
        Some(time) if ProgressMarkers::of(previous) == *now_markers => time,
        _ => now,
    }
}

/// Whether work still pending has gone `deadline_seconds` without progress.
pub fn deadline_exceeded(last_progress: Timestamp, now: Timestamp, deadline_seconds: i64) -> bool {
    let waited_ms = now.as_millisecond() - last_progress.as_millisecond();
    waited_ms > deadline_seconds.saturating_mul(1000)
}

/// Whether the StatefulSet status can show a stuck pod: it describes the current template, has
/// an update revision, and a pod is not Ready. Saves listing pods on every pass. Not judged by
/// `updateRevision != currentRevision`: a template set back to the revision the pods ran before
/// reuses that revision's name, so the two are equal while a pod of the bad revision still blocks.
pub fn may_have_stuck_pod(sts: &StatefulSet) -> bool {
    let Some(status) = &sts.status else {
        return false;
    };
    let current = status.observed_generation.is_some()
        && status.observed_generation >= sts.metadata.generation;
    current
        && status.update_revision.is_some()
        && status.ready_replicas.unwrap_or(0) < status.replicas
}

/// The pod to delete so the StatefulSet recreates it at the update revision: the highest ordinal
/// at or above the partition that runs an outdated revision and is not Ready. None while a pod
/// is terminating (one at a time) or the status is not about the current template.
pub fn stuck_pod(broker: &Broker, sts: &StatefulSet, pods: &[Pod]) -> Option<String> {
    if !may_have_stuck_pod(sts) {
        return None;
    }
    let update_revision = sts.status.as_ref()?.update_revision.as_deref()?;
    if pods
        .iter()
        .any(|pod| pod.metadata.deletion_timestamp.is_some())
    {
        return None;
    }
    let partition = current_partition(sts);
    let replicas = sts.spec.replicas.unwrap_or(0);
    (partition..replicas).rev().find_map(|ordinal| {
        let name = desired::pod_name(broker, ordinal);
        let pod = pods
            .iter()
            .find(|pod| pod.metadata.name.as_deref() == Some(&name))?;
        let revision = pod.metadata.labels.as_ref()?.get(REVISION_LABEL)?;
        (revision != update_revision && !is_ready(pod)).then_some(name)
    })
}

/// The partition the StatefulSet has now.
pub fn current_partition(sts: &StatefulSet) -> i32 {
    sts.spec
        .update_strategy
        .as_ref()
        .and_then(|strategy| strategy.rolling_update.as_ref())
        .and_then(|rolling| rolling.partition)
        .unwrap_or(0)
}

/// One pod of a replicated broker group, as the rollout sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberPod {
    /// Its replica id in the group.
    pub replica_id: u64,
    /// The pod's name.
    pub name: String,
    /// Whether it runs the StatefulSet's update revision.
    pub updated: bool,
    /// Whether it is Ready and not being deleted.
    pub ready: bool,
}

/// The next thing a replicated group's rollout does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GroupStep {
    /// Delete this pod; the StatefulSet (OnDelete) recreates it at the update revision.
    DeletePod(String),
    /// Ask the master (replica id `master`) to hand mastership to replica `target`.
    Switchover { master: u64, target: u64 },
    /// Nothing to do before the group changes; why.
    Wait(String),
    /// Every member runs the update revision.
    Done,
}

/// The next step of one replicated group's rollout, pure: replicas first (out-of-sync ones,
/// then the highest replica id), each only once every member is Ready and every updated member
/// is back in sync; then a switchover to an updated in-sync replica; the old master, now a
/// replica, goes last. `pods` are the group's members, by replica id; `status` the group's
/// replication status (None when no member answered).
pub fn next_group_step(
    size: usize,
    pods: &[MemberPod],
    status: Option<&ReplicationStatus>,
) -> GroupStep {
    // OnDelete creates a missing pod at the update revision: nothing for the rollout to do.
    if pods.iter().all(|pod| pod.updated) {
        return GroupStep::Done;
    }
    if pods.len() < size {
        return GroupStep::Wait(format!("{} of {size} pods exist", pods.len()));
    }
    if let Some(pod) = pods.iter().find(|pod| !pod.ready) {
        return GroupStep::Wait(format!("{} is not Ready", pod.name));
    }
    let Some(status) = status else {
        return GroupStep::Wait("no member reported the group's replication status".to_string());
    };
    let Some(master) = status.master_id else {
        return GroupStep::Wait(format!("the group has no master (epoch {})", status.epoch));
    };
    let in_sync = |id: u64| status.in_sync_replicas.contains(&id);
    if let Some(pod) = pods
        .iter()
        .find(|pod| pod.updated && !in_sync(pod.replica_id))
    {
        return GroupStep::Wait(format!("{} is catching up (not in sync)", pod.name));
    }
    // An outdated replica out of sync goes first: restarting it costs the in-sync set nothing.
    // An in-sync one only when every updated member is back in sync (checked above), so the
    // group never has two members catching up at once.
    let outdated: Vec<&MemberPod> = pods
        .iter()
        .rev()
        .filter(|pod| !pod.updated && pod.replica_id != master)
        .collect();
    let next = outdated
        .iter()
        .find(|pod| !in_sync(pod.replica_id))
        .or(outdated.first());
    if let Some(pod) = next {
        return GroupStep::DeletePod(pod.name.clone());
    }
    let Some(master_pod) = pods.iter().find(|pod| pod.replica_id == master) else {
        return GroupStep::Wait(format!("the master, replica {master}, is not a member pod"));
    };
    if master_pod.updated {
        // Unreachable while some pod is outdated and every outdated pod is the master; kept
        // for a status that names a master no pod is.
        return GroupStep::Done;
    }
    let target = pods
        .iter()
        .find(|pod| pod.updated && pod.replica_id != master && in_sync(pod.replica_id));
    match target {
        Some(target) => GroupStep::Switchover {
            master,
            target: target.replica_id,
        },
        None => GroupStep::Wait(format!(
            "no updated in-sync replica to hand mastership to before restarting {}",
            master_pod.name
        )),
    }
}

/// The members of group `group` among `pods`, by replica id, judged against the StatefulSet's
/// update revision.
pub fn member_pods(
    broker: &Broker,
    group: i32,
    pods: &[Pod],
    update_revision: &str,
) -> Vec<MemberPod> {
    desired::group_ordinals(broker, group)
        .filter_map(|ordinal| {
            let name = desired::pod_name(broker, ordinal);
            let pod = pods
                .iter()
                .find(|pod| pod.metadata.name.as_deref() == Some(&name))?;
            let revision = pod
                .metadata
                .labels
                .as_ref()
                .and_then(|labels| labels.get(REVISION_LABEL));
            let (_, replica) = desired::group_of(broker, ordinal);
            Some(MemberPod {
                replica_id: u64::try_from(replica).unwrap_or_default(),
                name,
                updated: revision.is_some_and(|revision| revision == update_revision),
                ready: is_up(pod),
            })
        })
        .collect()
}

/// Whether the pod is Ready and not being deleted.
pub fn is_up(pod: &Pod) -> bool {
    is_ready(pod) && pod.metadata.deletion_timestamp.is_none()
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|status| status.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|condition| condition.type_ == "Ready" && condition.status == "True")
        })
}

#[cfg(test)]
mod group_step_tests {
    use super::*;
    use crate::fixtures::BrokerFixture;
    use quiver_client::admin::standalone_status;

    fn pod(replica_id: u64, updated: bool, ready: bool) -> MemberPod {
        MemberPod {
            replica_id,
            name: format!("qb-{replica_id}"),
            updated,
            ready,
        }
    }

    /// A group of three with `master` and the in-sync set `in_sync`.
    fn status(master: Option<u64>, in_sync: &[u64]) -> ReplicationStatus {
        ReplicationStatus {
            master_id: master,
            in_sync_replicas: in_sync.to_vec(),
            epoch: 3,
            min_in_sync_replicas: 2,
            ..standalone_status("qb-g0", "qb-0:10911")
        }
    }

    #[test]
    fn replicas_go_first_highest_id_first_then_the_switchover_then_the_old_master() {
        let all = status(Some(0), &[0, 1, 2]);
        let pods = [
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, true),
        ];
        assert_eq!(
            next_group_step(3, &pods, Some(&all)),
            GroupStep::DeletePod("qb-2".into())
        );
        let pods = [pod(0, false, true), pod(1, false, true), pod(2, true, true)];
        assert_eq!(
            next_group_step(3, &pods, Some(&all)),
            GroupStep::DeletePod("qb-1".into())
        );
        let pods = [pod(0, false, true), pod(1, true, true), pod(2, true, true)];
        assert_eq!(
            next_group_step(3, &pods, Some(&all)),
            GroupStep::Switchover {
                master: 0,
                target: 1
            }
        );
        let switched = status(Some(1), &[0, 1, 2]);
        assert_eq!(
            next_group_step(3, &pods, Some(&switched)),
            GroupStep::DeletePod("qb-0".into()),
            "the old master is a replica now"
        );
        let pods = [pod(0, true, true), pod(1, true, true), pod(2, true, true)];
        assert_eq!(next_group_step(3, &pods, None), GroupStep::Done);
    }

    #[test]
    fn a_master_that_is_not_replica_zero_is_restarted_last() {
        let pods = [
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, true),
        ];
        let master_two = status(Some(2), &[0, 1, 2]);
        assert_eq!(
            next_group_step(3, &pods, Some(&master_two)),
            GroupStep::DeletePod("qb-1".into())
        );
        let pods = [pod(0, true, true), pod(1, true, true), pod(2, false, true)];
        assert_eq!(
            next_group_step(3, &pods, Some(&master_two)),
            GroupStep::Switchover {
                master: 2,
                target: 0
            },
            "the lowest updated in-sync replica"
        );
    }

    #[test]
    fn it_waits_for_ready_pods_caught_up_replicas_a_master_and_a_status() {
        let all = status(Some(0), &[0, 1, 2]);
        let restarting = [
            pod(0, false, true),
            pod(1, false, true),
            pod(2, true, false),
        ];
        assert_eq!(
            next_group_step(3, &restarting, Some(&all)),
            GroupStep::Wait("qb-2 is not Ready".into())
        );
        let catching_up = status(Some(0), &[0, 1]);
        let pods = [pod(0, false, true), pod(1, false, true), pod(2, true, true)];
        assert_eq!(
            next_group_step(3, &pods, Some(&catching_up)),
            GroupStep::Wait("qb-2 is catching up (not in sync)".into())
        );
        assert!(matches!(
            next_group_step(3, &pods, Some(&status(None, &[]))),
            GroupStep::Wait(reason) if reason.contains("no master")
        ));
        assert!(matches!(
            next_group_step(3, &pods, None),
            GroupStep::Wait(reason) if reason.contains("no member reported")
        ));
        assert!(matches!(
            next_group_step(3, &pods[..2], Some(&all)),
            GroupStep::Wait(reason) if reason == "2 of 3 pods exist"
        ));
    }

    #[test]
    fn an_out_of_sync_replica_goes_first_and_is_waited_for() {
        // Replica 1 fell out of sync: restarting it costs nothing, restarting 2 would.
        let degraded = status(Some(0), &[0, 2]);
        let pods = [
            pod(0, false, true),
            pod(1, false, true),
            pod(2, false, true),
        ];
        assert_eq!(
            next_group_step(3, &pods, Some(&degraded)),
            GroupStep::DeletePod("qb-1".into())
        );
        let pods = [pod(0, false, true), pod(1, true, true), pod(2, false, true)];
        assert_eq!(
            next_group_step(3, &pods, Some(&degraded)),
            GroupStep::Wait("qb-1 is catching up (not in sync)".into()),
            "qb-2 waits until qb-1 is back in sync"
        );
        let recovered = status(Some(0), &[0, 1, 2]);
        assert_eq!(
            next_group_step(3, &pods, Some(&recovered)),
            GroupStep::DeletePod("qb-2".into())
        );
    }

    #[test]
    fn without_an_updated_in_sync_replica_the_master_is_not_switched_over() {
        let pods = [pod(0, false, true), pod(1, true, true), pod(2, true, true)];
        let lagging = status(Some(0), &[0]);
        assert!(matches!(
            next_group_step(3, &pods, Some(&lagging)),
            GroupStep::Wait(reason) if reason.contains("catching up")
        ));
    }

    #[test]
    fn member_pods_read_revision_readiness_and_replica_id() {
        let broker = Broker::test().replicas(2).replicated(3, 2);
        let pod = |name: &str, revision: &str, ready: bool| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "labels": {REVISION_LABEL: revision}},
                "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
            }))
            .expect("pod")
        };
        let pods = [
            pod("qb-2", "new", true),
            pod("qb-3", "old", true),
            pod("qb-4", "new", false),
            pod("qb-5", "old", true),
        ];
        let members = member_pods(&broker, 1, &pods, "new");
        assert_eq!(
            members,
            [
                MemberPod {
                    replica_id: 0,
                    name: "qb-3".into(),
                    updated: false,
                    ready: true
                },
                MemberPod {
                    replica_id: 1,
                    name: "qb-4".into(),
                    updated: true,
                    ready: false
                },
                MemberPod {
                    replica_id: 2,
                    name: "qb-5".into(),
                    updated: false,
                    ready: true
                },
            ]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::BrokerFixture;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;

    fn existing(broker: &Broker, plan: &RolloutPlan, status: StatefulSetStatus) -> StatefulSet {
        let mut sts = desired::stateful_set(broker, plan);
        sts.metadata.generation = Some(4);
        sts.status = Some(StatefulSetStatus {
            observed_generation: Some(4),
            ..status
        });
        sts
    }

    fn ready(replicas: i32, updated: i32) -> StatefulSetStatus {
        StatefulSetStatus {
            replicas,
            ready_replicas: Some(replicas),
            updated_replicas: Some(updated),
            ..StatefulSetStatus::default()
        }
    }

    #[test]
    fn no_statefulset_means_create_everything_at_once() {
        let broker = Broker::test().replicas(3);
        let (plan, phase) = plan_rollout(&broker, None, 3, None);
        assert_eq!((plan.partition, phase), (0, RolloutPhase::Creating));
    }

    #[test]
    fn template_change_starts_at_the_highest_ordinal() {
        let old = Broker::test().replicas(3);
        let sts = existing(&old, &RolloutPlan::initial(&old), ready(3, 3));
        let new = old.clone().image("quiver:2");
        let (plan, phase) = plan_rollout(&new, Some(&sts), 3, None);
        assert_eq!((plan.partition, phase), (2, RolloutPhase::Started));
    }

    #[test]
    fn partition_steps_down_only_when_the_updated_pods_are_ready() {
        let broker = Broker::test().replicas(3);
        let at = |partition| RolloutPlan {
            partition,
            ..RolloutPlan::initial(&broker)
        };
        let waiting = existing(&broker, &at(2), ready(3, 0));
        assert_eq!(
            plan_rollout(&broker, Some(&waiting), 3, None).1,
            RolloutPhase::Waiting
        );
        let mut not_ready = ready(3, 1);
        not_ready.ready_replicas = Some(2);
        let restarting = existing(&broker, &at(2), not_ready);
        assert_eq!(
            plan_rollout(&broker, Some(&restarting), 3, None).1,
            RolloutPhase::Waiting
        );
        let done_top = existing(&broker, &at(2), ready(3, 1));
        let (plan, phase) = plan_rollout(&broker, Some(&done_top), 3, None);
        assert_eq!((plan.partition, phase), (1, RolloutPhase::Stepped));
        let done = existing(&broker, &at(0), ready(3, 3));
        assert_eq!(
            plan_rollout(&broker, Some(&done), 3, None).1,
            RolloutPhase::Complete
        );
    }

    #[test]
    fn stale_statefulset_status_does_not_step() {
        let broker = Broker::test().replicas(3);
        let mut sts = existing(
            &broker,
            &RolloutPlan {
                partition: 2,
                ..RolloutPlan::initial(&broker)
            },
            ready(3, 1),
        );
        sts.metadata.generation = Some(5);
        assert_eq!(
            plan_rollout(&broker, Some(&sts), 3, None).1,
            RolloutPhase::Waiting
        );
    }

    #[test]
    fn claim_size_is_kept_from_the_existing_statefulset() {
        let broker = Broker::test().replicas(1);
        let sts = existing(&broker, &RolloutPlan::initial(&broker), ready(1, 1));
        let grown = broker.clone().storage_size("20Gi");
        let (plan, _) = plan_rollout(&grown, Some(&sts), 1, None);
        assert_eq!(plan.claim_size, "10Gi");
    }

    fn pod(name: &str, revision: &str, ready: bool) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "labels": {REVISION_LABEL: revision}},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }))
        .expect("pod")
    }

    fn mid_rollout(broker: &Broker, partition: i32, ready_pods: i32) -> StatefulSet {
        let plan = RolloutPlan {
            partition,
            ..RolloutPlan::initial(broker)
        };
        let mut status = ready(3, 3 - partition);
        status.ready_replicas = Some(ready_pods);
        status.current_revision = Some("rev1".into());
        status.update_revision = Some("rev3".into());
        existing(broker, &plan, status)
    }

    #[test]
    fn an_outdated_pod_not_ready_in_the_update_range_is_the_one_to_delete() {
        let broker = Broker::test().replicas(3);
        let sts = mid_rollout(&broker, 2, 2);
        let pods = [
            pod("qb-0", "rev1", true),
            pod("qb-1", "rev1", true),
            pod("qb-2", "rev2", false),
        ];
        assert_eq!(stuck_pod(&broker, &sts, &pods), Some("qb-2".to_string()));
    }

    #[test]
    fn pods_at_the_update_revision_ready_pods_and_pods_below_the_partition_stay() {
        let broker = Broker::test().replicas(3);
        let sts = mid_rollout(&broker, 2, 2);
        // Crash-looping at the new revision: a spec problem, deleting would not help.
        let at_update = [pod("qb-1", "rev1", true), pod("qb-2", "rev3", false)];
        assert_eq!(stuck_pod(&broker, &sts, &at_update), None);
        // Not Ready below the partition: the rollout does not replace it.
        let below = [pod("qb-1", "rev1", false), pod("qb-2", "rev3", true)];
        assert_eq!(stuck_pod(&broker, &sts, &below), None);
        let mut terminating = pod("qb-2", "rev2", false);
        terminating.metadata.deletion_timestamp = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::UNIX_EPOCH),
        );
        assert_eq!(
            stuck_pod(&broker, &sts, &[terminating]),
            None,
            "one at a time"
        );
    }

    #[test]
    fn a_pod_of_the_bad_revision_is_stuck_after_the_template_goes_back_to_the_current_one() {
        let broker = Broker::test().replicas(3);
        // rev1 -> rev2 (bad) -> rev1 again: the StatefulSet reuses rev1, so update == current.
        let mut reverted = mid_rollout(&broker, 2, 2);
        if let Some(status) = reverted.status.as_mut() {
            status.update_revision = Some("rev1".into());
        }
        let pods = [
            pod("qb-0", "rev1", true),
            pod("qb-1", "rev1", true),
            pod("qb-2", "rev2", false),
        ];
        assert_eq!(
            stuck_pod(&broker, &reverted, &pods),
            Some("qb-2".to_string())
        );
    }

    #[test]
    fn a_stale_or_ready_statefulset_has_no_stuck_pod() {
        let broker = Broker::test().replicas(3);
        let mut stale = mid_rollout(&broker, 2, 2);
        stale.metadata.generation = Some(5);
        assert!(!may_have_stuck_pod(&stale));
        let mut unrevised = mid_rollout(&broker, 0, 2);
        if let Some(status) = unrevised.status.as_mut() {
            status.update_revision = None;
        }
        assert!(!may_have_stuck_pod(&unrevised));
        let all_ready = mid_rollout(&broker, 2, 3);
        assert!(!may_have_stuck_pod(&all_ready));
        assert!(may_have_stuck_pod(&mid_rollout(&broker, 2, 2)));
    }

    #[test]
    fn the_deadline_counts_from_the_last_change_of_the_markers() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(1_601).unwrap();
        let markers = ProgressMarkers {
            generation: Some(2),
            ready: 2,
            replicas: 3,
            rollout: Some((2, 1)),
            resized_claims: None,
        };
        let previous = BrokerStatus {
            observed_generation: Some(2),
            ready_replicas: 2,
            current_replicas: 3,
            rollout: Some(crate::crd::RolloutStatus {
                partition: 2,
                updated_replicas: 1,
            }),
            last_progress_time: Some(t0.to_string()),
            ..BrokerStatus::default()
        };
        assert_eq!(last_progress(&previous, &markers, t1), t0);
        assert!(deadline_exceeded(t0, t1, 600));
        assert!(!deadline_exceeded(t0, t1, 601));
        let moved = ProgressMarkers {
            ready: 3,
            ..markers.clone()
        };
        assert_eq!(last_progress(&previous, &moved, t1), t1);
        let claim_resized = ProgressMarkers {
            resized_claims: Some(1),
            ..markers.clone()
        };
        assert_eq!(last_progress(&previous, &claim_resized, t1), t1);
        let new_spec = ProgressMarkers {
            generation: Some(3),
            ..markers
        };
        assert_eq!(last_progress(&previous, &new_spec, t1), t1);
    }
}
