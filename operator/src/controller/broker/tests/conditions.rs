//! The conditions the brokers' answers set: DiskPressure, ReplicationDegraded and
//! VolumeExpansion, each with its one event when it turns (were the scenarios
//! broker_disk_pressure, broker_replication_degraded, broker_volume_expansion and
//! broker_expansion_refused).

use super::*;
use crate::disk::{BrokerDisk, DiskProbe};
use crate::fixtures::disk_report;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimStatus};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::time::Duration;

fn reported(used: f64, refusal: Option<&str>) -> DiskProbe {
    DiskProbe::Reported(disk_report(used, refusal))
}

fn disk(broker: &str, probe: DiskProbe) -> BrokerDisk {
    BrokerDisk {
        broker: broker.to_string(),
        probe,
    }
}

/// Pass after pass, qb-1's disk fills then has room again: DiskPressure turns True once (one
/// Warning event, the expansion to make), is checked every 30 s while it lasts, and clears
/// with a Normal event. Neither degrades the Broker nor takes Ready away.
#[test]
fn a_full_disk_sets_disk_pressure_until_the_broker_has_room_again() {
    struct Row {
        name: &'static str,
        qb_1: DiskProbe,
        condition: (&'static str, &'static str),
        message: &'static [&'static str],
        events: &'static [&'static str],
        requeue: Duration,
    }
    let rows = [
        Row {
            name: "room",
            qb_1: reported(0.25, None),
            condition: ("False", "DiskOK"),
            message: &[],
            events: &[],
            requeue: IDLE_REQUEUE,
        },
        Row {
            name: "qb-1 above its high water",
            qb_1: reported(0.93, Some("disk-high-water")),
            condition: ("True", "DiskAboveHighWater"),
            message: &[
                "qb-1: disk 93% used of 90% high water",
                "refuses sends (disk-high-water",
                "raise spec.storage.size (now 10Gi)",
            ],
            events: &["Warning DiskPressure"],
            requeue: DISK_PRESSURE_REQUEUE,
        },
        Row {
            name: "still above: no repeated warning",
            qb_1: reported(0.93, Some("disk-high-water")),
            condition: ("True", "DiskAboveHighWater"),
            message: &[],
            events: &[],
            requeue: DISK_PRESSURE_REQUEUE,
        },
        Row {
            name: "room again",
            qb_1: reported(0.47, None),
            condition: ("False", "DiskOK"),
            message: &[],
            events: &["Normal DiskPressureRelieved"],
            requeue: IDLE_REQUEUE,
        },
    ];
    let broker = Broker::test().replicas(2);
    let mut world = world(broker.clone(), running(&broker, 2, 2));
    for row in rows {
        cluster_mut(&mut world).disks =
            vec![disk("qb-0", reported(0.25, None)), disk("qb-1", row.qb_1)];
        let done = pass(&world);
        let (status, reason) = row.condition;
        assert_eq!(
            condition(&done.status, "DiskPressure"),
            (status.into(), reason.into()),
            "{}",
            row.name
        );
        let text = message(&done.status, "DiskPressure");
        for part in row.message {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        assert_eq!(done.events, row.events, "{}", row.name);
        assert_eq!(done.outlook.requeue(), row.requeue, "{}", row.name);
        assert_eq!(condition(&done.status, "Ready").0, "True", "{}", row.name);
        assert_eq!(
            condition(&done.status, "Degraded").0,
            "False",
            "{}",
            row.name
        );
        next(&mut world, &done);
    }
}

#[test]
fn a_broker_that_cannot_tell_leaves_disk_pressure_unknown() {
    let broker = Broker::test();
    // As an older broker answers GET_BROKER_RUNTIME_INFO.
    let refused = crate::admin::AdminError::Rejected {
        addr: BrokerAddr("qb-0.qb-headless.ns.svc:10911".into()),
        request: "GET_BROKER_RUNTIME_INFO",
        code: quiver_protocol::code::response::REQUEST_CODE_NOT_SUPPORTED,
        remark: "request type 28 not supported".to_string(),
    };
    let cluster = Cluster {
        disks: vec![disk("qb-0", DiskProbe::from_result(Err(refused)))],
        ..running(&broker, 1, 1)
    };
    let done = pass(&world(broker, cluster));
    assert_eq!(
        condition(&done.status, "DiskPressure"),
        ("Unknown".into(), "DiskUsageUnknown".into())
    );
    let text = message(&done.status, "DiskPressure");
    assert!(
        text.contains("qb-0 (older broker without GET_BROKER_RUNTIME_INFO)"),
        "{text}"
    );
    assert!(done.events.is_empty(), "{:?}", done.events);
    assert_eq!(
        condition(&done.status, "Ready"),
        ("True".into(), "AllBrokersReady".into())
    );
    assert_eq!(condition(&done.status, "Progressing").0, "False");
}

/// Two groups of three (minInSyncReplicas 2), pass after pass: qb-g1 falls to one in-sync
/// member, stays there, then recovers.
#[test]
fn a_group_below_its_minimum_is_degraded_until_the_set_recovers() {
    let all = [0, 1, 2];
    let rows = [
        (
            "in sync",
            all.to_vec(),
            ("False", "InSync"),
            vec![],
            IDLE_REQUEUE,
        ),
        (
            "qb-g1 below its minimum",
            vec![0],
            ("True", "BelowMinInSync"),
            vec!["Warning ReplicationDegraded"],
            DISK_PRESSURE_REQUEUE,
        ),
        (
            "still below: no repeated warning",
            vec![0],
            ("True", "BelowMinInSync"),
            vec![],
            DISK_PRESSURE_REQUEUE,
        ),
        (
            "recovered",
            all.to_vec(),
            ("False", "InSync"),
            vec!["Normal ReplicationRecovered"],
            IDLE_REQUEUE,
        ),
    ];
    let broker = Broker::test().replicas(2).replicated(3, 2);
    let mut world = world(broker.clone(), running(&broker, 6, 6));
    for (name, in_sync, (holds, reason), events, requeue) in rows {
        cluster_mut(&mut world).groups = Some(vec![
            members(0, 1, Some(0), &all),
            members(1, 1, Some(0), &in_sync),
        ]);
        let done = pass(&world);
        assert_eq!(
            condition(&done.status, "ReplicationDegraded"),
            (holds.into(), reason.into()),
            "{name}"
        );
        assert_eq!(done.events, events, "{name}");
        assert_eq!(done.outlook.requeue(), requeue, "{name}");
        if holds == "True" {
            let text = message(&done.status, "ReplicationDegraded");
            assert!(
                text.starts_with("qb-g1 has 1 in sync (qb-3), below minInSyncReplicas 2"),
                "{text}"
            );
            let group = &done
                .status
                .replication
                .as_ref()
                .expect("replication")
                .groups[1];
            assert_eq!(group.in_sync, ["qb-3"]);
            assert!(!group.members[1].in_sync);
            assert_eq!(group.members[1].lag_bytes, Some(3072));
        }
        next(&mut world, &done);
    }
}

#[test]
fn a_group_without_a_master_is_degraded() {
    let broker = Broker::test().replicas(1).replicated(3, 2);
    let mut world = world(broker.clone(), running(&broker, 3, 3));
    cluster_mut(&mut world).groups = Some(vec![members(0, 2, None, &[0, 1, 2])]);
    let lost = pass(&world);
    assert_eq!(
        condition(&lost.status, "ReplicationDegraded"),
        ("True".into(), "NoMaster".into())
    );
    let text = message(&lost.status, "ReplicationDegraded");
    assert!(text.contains("qb-g0 has no master (epoch 2)"), "{text}");
    let group = &lost
        .status
        .replication
        .as_ref()
        .expect("replication")
        .groups[0];
    assert_eq!(group.master, None);
    assert!(group.members.iter().all(|m| m.role == "Unknown"));
    next(&mut world, &lost);
    cluster_mut(&mut world).groups = Some(vec![members(0, 3, Some(2), &[0, 1, 2])]);
    let back = pass(&world);
    assert_eq!(
        condition(&back.status, "ReplicationDegraded"),
        ("False".into(), "InSync".into())
    );
    let group = &back
        .status
        .replication
        .as_ref()
        .expect("replication")
        .groups[0];
    assert_eq!(group.master.as_deref(), Some("qb-2"));
}

/// A claim requesting `request`, its volume at `capacity`.
fn sized(name: &str, request: &str, capacity: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        status: Some(PersistentVolumeClaimStatus {
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(capacity.to_string()),
            )])),
            ..PersistentVolumeClaimStatus::default()
        }),
        ..claim(name, request)
    }
}

/// The size in the claim template of the StatefulSet the plan applies.
fn template_size(plan: &Plan) -> String {
    let templates = sts_of(plan).spec.volume_claim_templates.clone();
    let requests = templates.expect("claim templates")[0]
        .spec
        .clone()
        .and_then(|spec| spec.resources)
        .and_then(|resources| resources.requests);
    requests.expect("requests")["storage"].0.clone()
}

/// 10Gi to 20Gi, the class allowing it: the claims are patched, the status follows their
/// resize, and the claim template (immutable) stays as created.
#[test]
fn claims_grow_and_the_status_follows_the_resize() {
    struct Row {
        name: &'static str,
        claims: [(&'static str, &'static str); 2],
        steps: &'static [&'static str],
        condition: &'static str,
        resized: i32,
        progressing: &'static str,
    }
    let rows = [
        Row {
            name: "asked for",
            claims: [("10Gi", "10Gi"), ("10Gi", "10Gi")],
            steps: &["resize data-qb-0,data-qb-1 to 20Gi"],
            condition: expansion::REASON_EXPANDING,
            resized: 0,
            progressing: "ExpandingVolumes",
        },
        Row {
            name: "patched, one volume resized",
            claims: [("20Gi", "20Gi"), ("20Gi", "10Gi")],
            steps: &[],
            condition: expansion::REASON_EXPANDING,
            resized: 1,
            progressing: "ExpandingVolumes",
        },
        Row {
            name: "every volume resized",
            claims: [("20Gi", "20Gi"), ("20Gi", "20Gi")],
            steps: &[],
            condition: expansion::REASON_EXPANDED,
            resized: 2,
            progressing: "Stable",
        },
    ];
    let before = Broker::test().replicas(2);
    let after = before.clone().storage_size("20Gi");
    for row in rows {
        let claims = row
            .claims
            .iter()
            .enumerate()
            .map(|(ordinal, (request, capacity))| {
                sized(&format!("data-qb-{ordinal}"), request, capacity)
            })
            .collect::<Vec<_>>();
        // The classes are read only while a claim is to grow.
        let classes = (!row.steps.is_empty()).then(|| Ok(vec![class(true)]));
        let cluster = Cluster {
            claims,
            storage_classes: classes,
            ..running(&before, 2, 2)
        };
        let done = pass(&world(after.clone(), cluster));
        assert_eq!(actions(&done.plan), row.steps, "{}", row.name);
        assert_eq!(
            condition(&done.status, expansion::CONDITION),
            ("True".into(), row.condition.into()),
            "{}",
            row.name
        );
        let storage = done.status.storage.clone().expect("storage status");
        assert_eq!(
            (storage.requested.as_str(), storage.total_claims),
            ("20Gi", 2)
        );
        assert_eq!(storage.resized_claims, row.resized, "{}", row.name);
        assert_eq!(condition(&done.status, "Progressing").1, row.progressing);
        assert_eq!(template_size(&done.plan), "10Gi", "{}", row.name);
    }
}

/// 10Gi to 20Gi, data-qb-1 never resized: once spec.progressDeadlineSeconds pass after the last
/// claim resized, Degraded names it (one Warning event); resized at last, Degraded clears.
#[test]
fn an_expansion_without_progress_past_the_deadline_degrades_naming_the_claim() {
    struct Row {
        name: &'static str,
        after_s: i64,
        qb_1_capacity: &'static str,
        degraded: (&'static str, &'static str),
        events: &'static [&'static str],
    }
    let rows = [
        Row {
            name: "qb-0 resized, qb-1 not yet",
            after_s: 0,
            qb_1_capacity: "10Gi",
            degraded: ("False", "AsExpected"),
            events: &[],
        },
        Row {
            name: "at the deadline",
            after_s: 600,
            qb_1_capacity: "10Gi",
            degraded: ("False", "AsExpected"),
            events: &[],
        },
        Row {
            name: "past the deadline",
            after_s: 601,
            qb_1_capacity: "10Gi",
            degraded: ("True", REASON_PROGRESS_DEADLINE),
            events: &["Warning ProgressDeadlineExceeded"],
        },
        Row {
            name: "still stuck: no repeated warning",
            after_s: 900,
            qb_1_capacity: "10Gi",
            degraded: ("True", REASON_PROGRESS_DEADLINE),
            events: &[],
        },
        Row {
            name: "resized at last",
            after_s: 960,
            qb_1_capacity: "20Gi",
            degraded: ("False", "AsExpected"),
            events: &[],
        },
    ];
    let before = Broker::test().replicas(2);
    let mut world = world(before.clone().storage_size("20Gi"), running(&before, 2, 2));
    for row in rows {
        world.now_ms = NOW_MS + row.after_s * 1000;
        cluster_mut(&mut world).claims = vec![
            sized("data-qb-0", "20Gi", "20Gi"),
            sized("data-qb-1", "20Gi", row.qb_1_capacity),
        ];
        let done = pass(&world);
        let (status, reason) = row.degraded;
        assert_eq!(
            condition(&done.status, "Degraded"),
            (status.into(), reason.into()),
            "{}",
            row.name
        );
        if status == "True" {
            let text = message(&done.status, "Degraded");
            assert!(
                text.contains("volume expansion to 20Gi made no progress for more than 600s")
                    && text.contains("claim data-qb-1 still has 10Gi")
                    && !text.contains("data-qb-0"),
                "{text}"
            );
        }
        assert_eq!(done.events, row.events, "{}", row.name);
        next(&mut world, &done);
    }
}

/// 10Gi to 20Gi and a new image at once, the class forbidding expansion: the claims are not
/// patched, VolumeExpansion says why with one Warning event, and the image still rolls.
#[test]
fn a_class_that_forbids_expansion_leaves_the_claims_and_the_image_still_rolls() {
    let before = Broker::test().replicas(2).image("quiver:1");
    let after = before.clone().storage_size("20Gi").image("quiver:2");
    let cluster = Cluster {
        claims: vec![claim("data-qb-0", "10Gi"), claim("data-qb-1", "10Gi")],
        storage_classes: Some(Ok(vec![class(false)])),
        ..running(&before, 2, 2)
    };
    let mut world = world(after, cluster);
    let refused = pass(&world);
    assert_eq!(actions(&refused.plan), ["event RolloutStarted"], "no patch");
    assert_eq!(
        refused.events,
        [
            "Normal RolloutStarted",
            "Warning StorageClassForbidsExpansion"
        ]
    );
    assert_eq!(
        condition(&refused.status, expansion::CONDITION),
        ("False".into(), "StorageClassForbidsExpansion".into())
    );
    let text = message(&refused.status, expansion::CONDITION);
    assert!(text.contains("StorageClass standard"), "{text}");
    let image = sts_of(&refused.plan)
        .spec
        .template
        .spec
        .clone()
        .expect("pod spec")
        .containers[0]
        .image
        .clone();
    assert_eq!(image.as_deref(), Some("quiver:2"));
    next(&mut world, &refused);
    let again = pass(&world);
    assert!(
        !again
            .events
            .contains(&"Warning StorageClassForbidsExpansion".to_string()),
        "one warning: {:?}",
        again.events
    );
}
