//! An offset reset in the spec is applied once per id and recorded in status.

use super::{addr, context, stored_group};
use crate::admin::ResetTarget;
use crate::controller::group::{reconcile, FINALIZER};
use crate::crd::{Broker, BrokerStatus, ConsumerGroup, OffsetResetSpec, OffsetResetTarget};
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer, GroupFixture};
use std::sync::Arc;

#[tokio::test]
async fn reset_applies_once_per_id() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = context(client, admin.clone());
    let broker = Broker::test().replicas(2).with_status(BrokerStatus {
        current_replicas: 2,
        ..BrokerStatus::default()
    });
    api.insert(&paths::broker("qb"), &broker);
    admin.set_queue(&addr(0), "billing", ("orders", 0), 100, Some(100), None);
    let mut group = ConsumerGroup::test();
    group.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    group.spec.offset_reset = Some(OffsetResetSpec {
        id: "replay-1".into(),
        to: OffsetResetTarget::Earliest,
        timestamp_millis: None,
    });
    api.insert(&paths::group("billing"), &group);

    reconcile(Arc::new(group), ctx.clone())
        .await
        .expect("applies the reset");
    let resets = admin.resets();
    assert_eq!(resets.len(), 2, "one per broker: {resets:?}");
    assert!(resets
        .iter()
        .all(|(_, group, topic, target)| group == "billing"
            && topic == "orders"
            && *target == ResetTarget::Earliest));
    let status = stored_group(&api).status.unwrap();
    let applied = status.applied_offset_reset.expect("recorded");
    assert_eq!(
        (applied.id.as_str(), applied.to),
        ("replay-1", OffsetResetTarget::Earliest)
    );
    assert_eq!(
        status.total_lag,
        Some(100),
        "lag reflects the rewound offsets"
    );
    assert_eq!(api.event_reasons(), vec!["OffsetsReset"]);

    reconcile(Arc::new(stored_group(&api)), ctx.clone())
        .await
        .expect("polls again");
    assert_eq!(admin.resets().len(), 2, "the same id is not applied twice");

    api.edit(&paths::group("billing"), |group| {
        group["spec"]["offsetReset"] = serde_json::json!({"id": "skip-1", "to": "Latest"});
    });
    reconcile(Arc::new(stored_group(&api)), ctx)
        .await
        .expect("applies the new reset");
    assert_eq!(admin.resets().len(), 4);
    assert_eq!(stored_group(&api).status.unwrap().total_lag, Some(0));
}
