//! An offset reset in the spec is applied once per id and recorded in status.

use super::group_support::{poll_after, simulated_context, two_brokers};
use super::{addr, stored_group, LAG_INTERVAL};
use crate::admin::ResetTarget;
use crate::controller::group::{reconcile, FINALIZER};
use crate::crd::{ConsumerGroup, OffsetResetSpec, OffsetResetTarget};
use crate::fixtures::{paths, FakeAdmin, FakeApiServer, GroupFixture};
use std::sync::Arc;

#[tokio::test]
async fn reset_applies_once_per_id() {
    let (client, api) = FakeApiServer::start();
    let admin = Arc::new(FakeAdmin::default());
    let ctx = simulated_context(client, admin.clone());
    two_brokers(&api);
    admin.set_queue(&addr(0), "billing", ("orders", 0), 100, Some(100), None);
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
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

    poll_after(&api, &ctx, LAG_INTERVAL)
        .await
        .expect("polls again");
    assert_eq!(admin.resets().len(), 2, "the same id is not applied twice");

    api.edit(&paths::group("billing"), |group| {
        group["spec"]["offsetReset"] = serde_json::json!({"id": "skip-1", "to": "Latest"});
        group["metadata"]["generation"] = 2.into();
    });
    reconcile(Arc::new(stored_group(&api)), ctx)
        .await
        .expect("applies the new reset");
    assert_eq!(admin.resets().len(), 4);
    assert_eq!(stored_group(&api).status.unwrap().total_lag, Some(0));
}
