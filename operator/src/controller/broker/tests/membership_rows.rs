//! A master's pod is never deleted before a switchover, and a `spec.replication.replicas`
//! change adds or removes members one at a time without restarting the others: each row is
//! the world one pass sees.

use super::*;
use crate::controller::rollout;

const fn addr_of(ordinal: i32) -> &'static str {
    match ordinal {
        0 => "qb-0.qb-headless.ns.svc:10911",
        1 => "qb-1.qb-headless.ns.svc:10911",
        _ => "qb-2.qb-headless.ns.svc:10911",
    }
}

/// Group 0 as the broker `answering` sees it: `members`, `master`, `in_sync`; `answered` are
/// the brokers that answered (members or joining).
fn observed(
    members: &[u64],
    master: u64,
    in_sync: &[u64],
    answering: u64,
    answered: &[u64],
) -> GroupObservation {
    let mut status = standalone_status("qb-g0", addr_of(master as i32));
    status.replica_id = answering;
    status.master_id = Some(master);
    status.epoch = 3;
    status.in_sync_replicas = in_sync.to_vec();
    status.replicas = members
        .iter()
        .map(|&id| ReplicaStatus {
            replica_id: id,
            address: addr_of(id as i32).to_string(),
            role: if id == master {
                ReplicaRole::Master
            } else {
                ReplicaRole::Replica
            },
            in_sync: in_sync.contains(&id),
            log_end: 4096,
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

/// A group of `size` pods made for `made_for`, all Ready at the update revision but those in
/// `not_ready` (at the outdated revision rev-1 then).
fn replicated_cluster(made_for: &Broker, pods_made: i32, not_ready: &[i32]) -> Cluster {
    let mut cluster = running(made_for, pods_made, pods_made - not_ready.len() as i32);
    let listed = (0..pods_made)
        .map(|ordinal| {
            let stuck = not_ready.contains(&ordinal);
            let revision = if stuck { "rev-1" } else { "rev-2" };
            pod(&format!("qb-{ordinal}"), revision, !stuck)
        })
        .collect();
    cluster.pods = Some(Ok(listed));
    cluster
}

fn template_hash_of(plan: &Plan) -> Option<String> {
    rollout::template_hash(sts_of(plan))
}

fn group_members_of(plan: &Plan, pod: &str) -> Vec<String> {
    let config = config_of(plan, pod);
    serde_json::from_value(config["group-members"].clone()).expect("a list")
}

/// The stuck-pod repair deletes an outdated pod that is not Ready at once, but a master's
/// only after a switchover to an in-sync replica whose pod is up; a master that does not
/// answer is deleted with a Warning that the group elects.
#[test]
fn a_stuck_master_is_switched_over_before_its_pod_is_deleted() {
    let broker = Broker::test().replicas(1).replicated(3, 2);
    let rows = [
        (
            "the master answers: switch over first",
            observed(&[0, 1, 2], 0, &[0, 1, 2], 0, &[0, 1, 2]),
            vec!["switchover qb-0.qb-headless.ns.svc:10911 to 1"],
            "Normal Switchover",
        ),
        (
            "switched over: qb-0 is a replica, delete it",
            observed(&[0, 1, 2], 1, &[0, 1, 2], 1, &[0, 1, 2]),
            vec!["delete pod qb-0"],
            "Warning StuckPodDeleted",
        ),
        (
            "the master does not answer: deleting it is an election",
            observed(&[0, 1, 2], 0, &[0, 1, 2], 1, &[1, 2]),
            vec!["delete pod qb-0"],
            "Warning StuckPodDeleted",
        ),
    ];
    for (name, group, steps, event) in rows {
        let mut cluster = replicated_cluster(&broker, 3, &[0]);
        cluster.groups = Some(vec![group]);
        let done = pass(&world(broker.clone(), cluster));
        assert_eq!(actions(&done.plan), steps, "{name}");
        assert_eq!(
            done.events.first().map(String::as_str),
            Some(event),
            "{name}"
        );
    }
    let mut cluster = replicated_cluster(&broker, 3, &[0]);
    cluster.groups = Some(vec![observed(&[0, 1, 2], 0, &[0, 1, 2], 1, &[1, 2])]);
    let plan = decide(&world(broker.clone(), cluster));
    let note = note_of(&plan, "StuckPodDeleted");
    assert!(
        note.contains("master of qb-g0 and does not answer"),
        "{note}"
    );
    let mut cluster = replicated_cluster(&broker, 3, &[0]);
    cluster.groups = Some(vec![observed(&[0, 1, 2], 0, &[0, 1, 2], 0, &[0, 1, 2])]);
    let plan = decide(&world(broker, cluster));
    let note = note_of(&plan, "Switchover");
    assert_eq!(
        note,
        "qb-g0: mastership moved from qb-0 to qb-1 before deleting qb-0"
    );
}

/// Scale 2 -> 3: the StatefulSet runs a third pod at once, at the same template (no member
/// restarts); the new member is added once it answers; each member's file lists the
/// membership it holds, the new pod's spec's members.
#[test]
fn a_replicas_increase_adds_the_new_member_and_restarts_none() {
    let two = Broker::test().replicas(1).replicated(2, 1);
    let three = Broker::test().replicas(1).replicated(3, 1);
    let before = rollout::template_hash(&statefulset(&two, 2, 2));
    let rows = [
        (
            "the third pod is starting",
            observed(&[0, 1], 0, &[0, 1], 0, &[0, 1]),
            vec![],
            vec!["0=qb-0", "1=qb-1"],
        ),
        (
            "it answers: add it",
            observed(&[0, 1], 0, &[0, 1], 0, &[0, 1, 2]),
            vec!["add 2 at qb-0.qb-headless.ns.svc:10911"],
            vec!["0=qb-0", "1=qb-1"],
        ),
        (
            "added",
            observed(&[0, 1, 2], 0, &[0, 1, 2], 0, &[0, 1, 2]),
            vec![],
            vec!["0=qb-0", "1=qb-1", "2=qb-2"],
        ),
    ];
    for (name, group, steps, listed) in rows {
        let mut cluster = replicated_cluster(&two, 2, &[]);
        let mut sts = statefulset(&three, 3, 3);
        sts.spec.replicas = Some(3);
        cluster.statefulset = Some(sts);
        cluster.groups = Some(vec![group.clone()]);
        if let Some(Ok(pods)) = cluster.pods.as_mut() {
            pods.push(pod("qb-2", "rev-2", false));
        }
        let done = pass(&world(three.clone(), cluster));
        assert_eq!(actions(&done.plan), steps, "{name}");
        assert_eq!(sts_of(&done.plan).spec.replicas, Some(3), "{name}");
        assert_eq!(
            template_hash_of(&done.plan),
            before,
            "{name}: nothing restarts"
        );
        let short = |entry: &String| entry.split('.').next().unwrap_or_default().to_string();
        let members: Vec<String> = group_members_of(&done.plan, "qb-0")
            .iter()
            .map(short)
            .collect();
        assert_eq!(members, listed, "{name}");
        let joining: Vec<String> = group_members_of(&done.plan, "qb-2")
            .iter()
            .map(short)
            .collect();
        assert_eq!(joining, ["0=qb-0", "1=qb-1", "2=qb-2"], "{name}");
        let in_progress = group.membership().is_none_or(|members| members.len() != 3);
        assert_eq!(draft(&done.plan).replicated_rolling, in_progress, "{name}");
    }
}

/// Scale 3 -> 2: the master is switched away from the member to remove, then it is removed,
/// its pod kept (and its file placing it in its group) until then; no member restarts.
#[test]
fn a_replicas_decrease_switches_the_master_away_then_removes_it_then_its_pod() {
    let three = Broker::test().replicas(1).replicated(3, 1);
    let two = Broker::test().replicas(1).replicated(2, 1);
    let before = rollout::template_hash(&statefulset(&three, 3, 3));
    let rows = [
        (
            "qb-2 is the master: switch over to a kept in-sync replica",
            observed(&[0, 1, 2], 2, &[0, 1, 2], 2, &[0, 1, 2]),
            vec!["switchover qb-2.qb-headless.ns.svc:10911 to 0"],
            3,
        ),
        (
            "then remove it",
            observed(&[0, 1, 2], 0, &[0, 1, 2], 0, &[0, 1, 2]),
            vec!["remove 2 at qb-0.qb-headless.ns.svc:10911"],
            3,
        ),
        (
            "removed: its pod goes",
            observed(&[0, 1], 0, &[0, 1], 0, &[0, 1, 2]),
            vec![],
            2,
        ),
    ];
    for (name, group, steps, pods) in rows {
        let mut cluster = replicated_cluster(&three, 3, &[]);
        cluster.groups = Some(vec![group]);
        let done = pass(&world(two.clone(), cluster));
        assert_eq!(actions(&done.plan), steps, "{name}");
        assert_eq!(sts_of(&done.plan).spec.replicas, Some(pods), "{name}");
        assert_eq!(
            template_hash_of(&done.plan),
            before,
            "{name}: nothing restarts"
        );
        if pods == 3 {
            let kept = config_of(&done.plan, "qb-2");
            assert_eq!(kept["broker-name"], "qb-g0", "{name}");
            assert_eq!(kept["replica-id"], 2, "{name}");
            assert!(kept["peers"].as_array().is_none_or(Vec::is_empty), "{name}");
        }
    }
}
