//! Rollouts pass by pass (were the scenarios broker_rollout, broker_rollout_stuck and
//! broker_replicated_rollout): each row is the world one pass sees while the StatefulSet and
//! its pods move.

use super::*;
use crate::controller::rollout;

/// An image change rolls one pod at a time: the partition steps down from the highest ordinal
/// once the pod above it runs the new template and every pod is Ready; a pod not Ready holds
/// the rollout, so two are never down at once.
#[test]
fn an_image_change_rolls_one_pod_at_a_time_from_the_highest_ordinal() {
    let before = Broker::test().replicas(3).image("quiver:1");
    let after = before.clone().image("quiver:2");
    // (row, StatefulSet as the pass finds it, the pods' revisions and readiness, the
    // partition applied, the events)
    let rows = [
        (
            "the template changed",
            statefulset(&before, 3, 3),
            None,
            2,
            vec!["Normal RolloutStarted"],
        ),
        (
            "qb-2 restarting",
            rolling(&after, 3, 2, 1, 2),
            Some(pods(&[("rev-1", true), ("rev-1", true), ("rev-2", false)])),
            2,
            vec![],
        ),
        (
            "qb-2 Ready",
            rolling(&after, 3, 2, 1, 3),
            None,
            1,
            vec!["Normal RolloutStep"],
        ),
        (
            "qb-1 restarting",
            rolling(&after, 3, 1, 2, 2),
            Some(pods(&[("rev-1", true), ("rev-2", false), ("rev-2", true)])),
            1,
            vec![],
        ),
        (
            "qb-1 Ready",
            rolling(&after, 3, 1, 2, 3),
            None,
            0,
            vec!["Normal RolloutStep"],
        ),
        (
            "every pod on the new template",
            revisions(rolling(&after, 3, 0, 3, 3), "rev-2", "rev-2"),
            None,
            0,
            vec![],
        ),
    ];
    for (name, sts, listed, partition, events) in rows {
        let cluster = Cluster {
            statefulset: Some(sts),
            pods: listed.map(Ok),
            ..Cluster::default()
        };
        let done = pass(&world(after.clone(), cluster));
        let applied = rollout::current_partition(sts_of(&done.plan));
        assert_eq!(applied, partition, "{name}");
        assert_eq!(done.events, events, "{name}");
        if events.contains(&"Normal RolloutStep") {
            let note = note_of(&done.plan, "RolloutStep");
            assert_eq!(note, format!("updating qb-{partition}"), "{name}");
        }
    }
    let settled = Cluster {
        statefulset: Some(revisions(rolling(&after, 3, 0, 3, 3), "rev-2", "rev-2")),
        ..Cluster::default()
    };
    let done = pass(&world(after.clone(), settled));
    assert!(done.status.rollout.is_none(), "no rollout left in status");
    assert_eq!(
        condition(&done.status, "Progressing"),
        ("False".into(), "Stable".into())
    );
    assert_eq!(done.status.observed_generation, after.metadata.generation);
}

const DEADLINE_SECONDS: i64 = 120;

/// The Broker rolled to quiver:bad, with spec.progressDeadlineSeconds 120.
fn bad_broker() -> Broker {
    let mut bad = Broker::test()
        .replicas(3)
        .image("quiver:1")
        .image("quiver:bad");
    bad.spec.progress_deadline_seconds = DEADLINE_SECONDS;
    bad
}

/// The Broker edited after the bad rollout: only the image changed, at a new generation.
fn edited(image: &str) -> Broker {
    let mut broker = bad_broker();
    broker.spec.image = image.to_string();
    broker.metadata.generation = Some(4);
    broker
}

/// Three brokers rolled to an image that never becomes Ready: qb-2 (at the update revision
/// rev-2) crash-loops, qb-0 and qb-1 serve at the old one.
fn stuck_on_a_bad_image() -> World {
    let bad = bad_broker();
    let cluster = Cluster {
        statefulset: Some(rolling(&bad, 3, 2, 1, 2)),
        pods: Some(Ok(pods(&[
            ("rev-1", true),
            ("rev-1", true),
            ("rev-2", false),
        ]))),
        ..Cluster::default()
    };
    world(bad, cluster)
}

/// No progress for spec.progressDeadlineSeconds: Degraded ProgressDeadlineExceeded with a
/// Warning event; a pod not Ready at the update revision is a spec problem, left alone.
#[test]
fn a_rollout_without_progress_past_the_deadline_is_degraded_and_leaves_the_new_pod() {
    let mut world = stuck_on_a_bad_image();
    let first = pass(&world);
    assert_eq!(condition(&first.status, "Degraded").0, "False");
    assert!(
        actions(&first.plan).is_empty(),
        "{:?}",
        actions(&first.plan)
    );
    next(&mut world, &first);
    world.now_ms += (DEADLINE_SECONDS + 1) * 1000;
    let late = pass(&world);
    assert_eq!(
        condition(&late.status, "Degraded"),
        ("True".into(), "ProgressDeadlineExceeded".into())
    );
    assert_eq!(late.events, ["Warning ProgressDeadlineExceeded"]);
    assert!(
        actions(&late.plan).is_empty(),
        "a pod at the update revision is a spec problem: left alone"
    );
    assert_eq!(
        draft(&late.plan).plan.partition,
        2,
        "only the highest ordinal tried"
    );
}

/// Editing the CR recovers, with a third image or the previous good one (whose revision the
/// StatefulSet reuses, so update and current revision are equal): the pod stuck at the bad
/// revision is deleted, so the StatefulSet recreates it; once every pod is Ready, Degraded
/// clears.
#[test]
fn an_edit_deletes_the_pod_stuck_at_the_bad_revision_and_recovers() {
    let bad_pods = pods(&[("rev-1", true), ("rev-1", true), ("rev-2", false)]);
    let third = edited("quiver:3");
    let good = edited("quiver:1");
    let rows = [
        (
            "a third image",
            &third,
            revisions(rolling(&third, 3, 2, 0, 2), "rev-3", "rev-1"),
        ),
        (
            "the previous good image",
            &good,
            revisions(rolling(&good, 3, 2, 2, 2), "rev-1", "rev-1"),
        ),
    ];
    for (name, broker, sts) in rows {
        let mut world = stuck_on_a_bad_image();
        let late = {
            let first = pass(&world);
            next(&mut world, &first);
            world.now_ms += (DEADLINE_SECONDS + 1) * 1000;
            pass(&world)
        };
        next(&mut world, &late);
        world.broker.spec = broker.spec.clone();
        world.broker.metadata.generation = broker.metadata.generation;
        *cluster_mut(&mut world) = Cluster {
            statefulset: Some(sts.clone()),
            pods: Some(Ok(bad_pods.clone())),
            ..Cluster::default()
        };
        let fix = pass(&world);
        assert_eq!(actions(&fix.plan), ["delete pod qb-2"], "{name}");
        assert!(fix.events.contains(&"Warning StuckPodDeleted".to_string()));
        let note = note_of(&fix.plan, "StuckPodDeleted");
        assert!(note.contains("qb-2"), "{note}");
        next(&mut world, &fix);

        let update = sts.status.as_ref().and_then(|s| s.update_revision.clone());
        let update = update.expect("an update revision");
        *cluster_mut(&mut world) = Cluster {
            statefulset: Some(revisions(rolling(broker, 3, 0, 3, 3), &update, &update)),
            ..Cluster::default()
        };
        let recovered = pass(&world);
        assert_eq!(
            condition(&recovered.status, "Degraded").0,
            "False",
            "{name}"
        );
        assert_eq!(
            recovered.status.observed_generation,
            world.broker.metadata.generation
        );
    }
}

/// An image change on a replicated group of three, pass by pass: replicas first (highest
/// replica id first), one pod down at a time; then a switchover asked of the master, to an
/// updated in-sync replica; then the old master. Each step is an event.
#[test]
fn a_rollout_restarts_replicas_then_switches_over_then_restarts_the_old_master() {
    let before = Broker::test()
        .replicas(1)
        .replicated(3, 2)
        .image("quiver:1");
    let after = before.clone().image("quiver:2");
    let all = [0, 1, 2];
    // (row, revisions and readiness of qb-0..qb-2, master, epoch, steps, events)
    let rows = [
        (
            "the highest replica first",
            [("rev-1", true), ("rev-1", true), ("rev-1", true)],
            0,
            1,
            vec!["delete pod qb-2"],
            vec!["Normal RolloutStep"],
        ),
        (
            "qb-2 restarting: nothing else goes",
            [("rev-1", true), ("rev-1", true), ("rev-2", false)],
            0,
            1,
            vec![],
            vec![],
        ),
        (
            "then the next replica",
            [("rev-1", true), ("rev-1", true), ("rev-2", true)],
            0,
            1,
            vec!["delete pod qb-1"],
            vec!["Normal RolloutStep"],
        ),
        (
            "then a switchover, asked of the master",
            [("rev-1", true), ("rev-2", true), ("rev-2", true)],
            0,
            1,
            vec!["switchover qb-0.qb-headless.ns.svc:10911 to 1"],
            vec!["Normal Switchover"],
        ),
        (
            "then the old master",
            [("rev-1", true), ("rev-2", true), ("rev-2", true)],
            1,
            2,
            vec!["delete pod qb-0"],
            vec!["Normal RolloutStep"],
        ),
        (
            "done",
            [("rev-2", true), ("rev-2", true), ("rev-2", true)],
            1,
            2,
            vec![],
            vec![],
        ),
    ];
    let started = pass(&world(after.clone(), running(&before, 3, 3)));
    assert_eq!(started.events, ["Normal RolloutStarted"]);
    for (name, each, master, epoch, steps, events) in rows {
        let cluster = Cluster {
            pods: Some(Ok(pods(&each))),
            groups: Some(vec![members(0, epoch, Some(master), &all)]),
            ..running(&after, 3, 3)
        };
        let done = pass(&world(after.clone(), cluster));
        assert_eq!(actions(&done.plan), steps, "{name}");
        assert_eq!(done.events, events, "{name}");
        let rolling = name != "done";
        assert_eq!(draft(&done.plan).replicated_rolling, rolling, "{name}");
        if rolling {
            assert_eq!(condition(&done.status, "Progressing").1, "RollingUpdate");
        } else {
            assert!(done.status.rollout.is_none(), "no rollout left in status");
            let group = &done
                .status
                .replication
                .as_ref()
                .expect("replication")
                .groups[0];
            assert_eq!(group.master.as_deref(), Some("qb-1"));
            assert_eq!(group.epoch, Some(2));
        }
    }
}

/// An out-of-sync replica restarts first (that costs the in-sync set nothing), and nothing
/// else restarts until it is back in sync.
#[test]
fn a_rollout_restarts_an_out_of_sync_replica_first_and_waits_for_it_to_catch_up() {
    let broker = Broker::test()
        .replicas(1)
        .replicated(3, 2)
        .image("quiver:2");
    let rows = [
        (
            "qb-1 out of sync goes first",
            [("rev-1", true), ("rev-1", true), ("rev-1", true)],
            vec![0, 2],
            vec!["delete pod qb-1"],
        ),
        (
            "qb-1 back but catching up: qb-2 kept",
            [("rev-1", true), ("rev-2", true), ("rev-1", true)],
            vec![0, 2],
            vec![],
        ),
        (
            "qb-1 in sync: the next replica",
            [("rev-1", true), ("rev-2", true), ("rev-1", true)],
            vec![0, 1, 2],
            vec!["delete pod qb-2"],
        ),
    ];
    for (name, each, in_sync, steps) in rows {
        let cluster = Cluster {
            pods: Some(Ok(pods(&each))),
            groups: Some(vec![members(0, 1, Some(0), &in_sync)]),
            ..running(&broker, 3, 3)
        };
        let plan = decide(&world(broker.clone(), cluster));
        assert_eq!(actions(&plan), steps, "{name}");
        assert!(draft(&plan).replicated_rolling, "{name}");
    }
}

/// Groups roll on their own: group 0 waits for its crash-looping replica while group 1 takes
/// its next step in the same pass (under one shared order group 1 would wait for group 0).
#[test]
fn a_group_waiting_for_a_pod_holds_back_no_other_group() {
    let broker = Broker::test().replicas(2).replicated(3, 2);
    // qb-1 crash-loops at the update revision: not a stuck pod, a group that waits.
    let mut cluster = running(&broker, 6, 5);
    cluster.pods = Some(Ok(pods(&[
        ("rev-1", true),
        ("rev-2", false),
        ("rev-1", true),
        ("rev-1", true),
        ("rev-1", true),
        ("rev-1", true),
    ])));
    cluster.groups = Some(vec![
        members(0, 1, Some(0), &[0, 2]),
        members(1, 1, Some(0), &[0, 1, 2]),
    ]);
    let plan = decide(&world(broker, cluster));
    assert_eq!(actions(&plan), ["delete pod qb-5"]);
    assert!(draft(&plan).replicated_rolling);

    // Both groups ready to step: each takes its own step in the same pass.
    let broker = Broker::test().replicas(2).replicated(3, 2);
    let mut cluster = running(&broker, 6, 6);
    cluster.pods = Some(Ok(pods(&[("rev-1", true); 6])));
    cluster.groups = Some(vec![
        members(0, 1, Some(0), &[0, 1, 2]),
        members(1, 1, Some(0), &[0, 1, 2]),
    ]);
    let plan = decide(&world(broker, cluster));
    assert_eq!(actions(&plan), ["delete pod qb-2", "delete pod qb-5"]);
}

/// A StatefulSet an older operator made with OrderedReady (which an apply cannot change) is
/// deleted with its pods orphaned instead of applied; the next pass, finding none, creates it
/// with Parallel; one already Parallel is applied as usual.
#[test]
fn an_ordered_ready_statefulset_is_orphaned_to_be_created_again() {
    let broker = Broker::test().replicas(3);
    let mut legacy = statefulset(&broker, 3, 3);
    legacy.spec.pod_management_policy = Some("OrderedReady".to_string());
    let plan = decide(&world(
        broker.clone(),
        Cluster {
            statefulset: Some(legacy),
            ..Cluster::default()
        },
    ));
    assert_eq!(actions(&plan), ["orphan StatefulSet"]);
    assert!(!applied_names(&plan).contains(&"StatefulSet/qb".to_string()));
    let note = plan
        .steps
        .iter()
        .find_map(|step| match step {
            Step::OrphanStatefulSet(note) => Some(note.note.clone()),
            _ => None,
        })
        .expect("an orphaning step");
    assert!(
        note.starts_with("podManagementPolicy OrderedReady becomes Parallel"),
        "{note}"
    );

    // Not while a pod is not Ready: the apply keeps OrderedReady, which it cannot change.
    let mut starting = statefulset(&broker, 3, 2);
    starting.spec.pod_management_policy = Some("OrderedReady".to_string());
    let plan = decide(&world(
        broker.clone(),
        Cluster {
            statefulset: Some(starting),
            ..Cluster::default()
        },
    ));
    assert!(!actions(&plan).contains(&"orphan StatefulSet".to_string()));
    assert_eq!(
        sts_of(&plan).spec.pod_management_policy.as_deref(),
        Some("OrderedReady")
    );

    let plan = decide(&world(broker.clone(), Cluster::default()));
    assert_eq!(
        sts_of(&plan).spec.pod_management_policy.as_deref(),
        Some("Parallel")
    );
    let plan = decide(&world(broker.clone(), running(&broker, 3, 3)));
    assert!(actions(&plan).is_empty(), "{:?}", actions(&plan));
}
