//! A broker reporting a full disk sets DiskPressure (with a Warning event and the storage
//! expansion to make); it clears once the broker has room again. Brokers that cannot tell leave
//! it Unknown without failing the reconcile.

use super::{addr, condition, context, settle_statefulset, stored_broker};
use crate::controller::broker::{reconcile, DISK_PRESSURE_REQUEUE, IDLE_REQUEUE};
use crate::crd::Broker;
use crate::fixtures::{disk_report, paths, BrokerFixture, FakeAdmin, FakeApiServer};
use kube::runtime::controller::Action;
use std::sync::Arc;

fn disk_message(api: &FakeApiServer) -> String {
    let status = stored_broker(api).status.expect("status");
    status
        .conditions
        .iter()
        .find(|condition| condition.type_ == "DiskPressure")
        .expect("DiskPressure condition")
        .message
        .clone()
}

#[tokio::test]
async fn a_full_disk_sets_disk_pressure_until_the_broker_has_room_again() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = context(client, admin.clone());
    let broker = Broker::test().replicas(2);
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "DiskPressure"),
        ("Unknown".into(), "DiskUsageUnknown".into()),
        "no StatefulSet yet: nobody to ask"
    );
    settle_statefulset(&api, 2, 2);
    let action = reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("settles");
    assert_eq!(action, Action::requeue(IDLE_REQUEUE));
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "DiskPressure"),
        ("False".into(), "DiskOK".into())
    );

    // qb-1's disk fills past its high water: it refuses sends.
    admin.set_runtime_info(&addr(1), Some(disk_report(0.93, Some("disk-high-water"))));
    let action = reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("a full disk does not fail the reconcile");
    assert_eq!(
        action,
        Action::requeue(DISK_PRESSURE_REQUEUE),
        "checked again soon"
    );
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "DiskPressure"),
        ("True".into(), "DiskAboveHighWater".into())
    );
    assert_eq!(
        condition(&status.conditions, "Ready").0,
        "True",
        "reads are still served"
    );
    let message = disk_message(&api);
    for part in [
        "qb-1: disk 93% used of 90% high water",
        "refuses sends (disk-high-water",
        "raise spec.storage.size (now 10Gi)",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    assert!(!message.contains("qb-0"), "{message}");
    assert_eq!(
        api.event_reasons()
            .iter()
            .filter(|reason| *reason == "DiskPressure")
            .count(),
        1
    );

    // Still full at the next check: no second warning.
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(
        api.event_reasons()
            .iter()
            .filter(|reason| *reason == "DiskPressure")
            .count(),
        1
    );

    // The user grows the volumes; once they are bigger the broker is writable again.
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["storage"]["size"] = "20Gi".into()
    });
    admin.set_runtime_info(&addr(1), Some(disk_report(0.47, None)));
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("reconciles");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "DiskPressure"),
        ("False".into(), "DiskOK".into())
    );
    assert!(disk_message(&api).contains("qb-1: disk 47% used"));
    assert!(api
        .event_reasons()
        .contains(&"DiskPressureRelieved".to_string()));
}

#[tokio::test]
async fn older_or_unreachable_brokers_leave_disk_pressure_unknown() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = context(client, admin.clone());
    let broker = Broker::test().replicas(2);
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    settle_statefulset(&api, 2, 2);
    admin.set_runtime_info(&addr(0), None);
    admin.set_runtime_info(&addr(1), None);
    let action = reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("REQUEST_CODE_NOT_SUPPORTED does not fail the reconcile");
    assert_eq!(action, Action::requeue(IDLE_REQUEUE));
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "DiskPressure"),
        ("Unknown".into(), "DiskUsageUnknown".into())
    );
    assert!(
        disk_message(&api).contains("qb-0 (older broker without GET_BROKER_RUNTIME_INFO)"),
        "{}",
        disk_message(&api)
    );

    // One broker answers again, the other cannot be reached: decided from the one.
    admin.set_runtime_info(&addr(0), Some(disk_report(0.3, None)));
    admin.make_unreachable(&addr(1));
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("an unreachable broker does not fail the reconcile");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "DiskPressure"),
        ("False".into(), "DiskOK".into())
    );
    let message = disk_message(&api);
    assert!(
        message.contains("unknown on qb-1 (did not answer"),
        "{message}"
    );
    assert!(!api.event_reasons().iter().any(|r| r.starts_with("Disk")));
}

#[tokio::test]
async fn a_refusal_that_more_space_cannot_fix_is_writes_refused() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = context(client, admin.clone());
    let broker = Broker::test();
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    settle_statefulset(&api, 1, 1);
    admin.set_runtime_info(&addr(0), Some(disk_report(0.2, Some("read-only-fs"))));
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("reconciles");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "DiskPressure"),
        ("True".into(), "WritesRefused".into())
    );
    let message = disk_message(&api);
    assert!(
        message.contains("qb-0: disk 20% used") && message.contains("read-only-fs"),
        "{message}"
    );
    assert!(message.contains("more space will not help"), "{message}");
    assert!(api.event_reasons().contains(&"DiskPressure".to_string()));
}
