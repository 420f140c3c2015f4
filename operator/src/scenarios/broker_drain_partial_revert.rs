//! A scale-down reverted half-way (5 -> 2, then 3 mid-drain): the broker that stays becomes
//! writable again at once, the two still leaving keep draining.

use super::broker_scale_down::{settled_brokers, sts_replicas};
use super::{addr, stored_broker};
use crate::admin::BrokerPermission;
use crate::controller::broker::reconcile;
use crate::fixtures::paths;
use std::sync::Arc;

#[tokio::test]
async fn the_kept_broker_is_writable_and_the_others_keep_draining() {
    let (api, admin, ctx) = settled_brokers(5).await;
    for ordinal in 2..5 {
        admin.set_queue(
            &addr(ordinal),
            "billing",
            ("orders", 0),
            100,
            Some(40),
            None,
        );
    }
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("drains qb-2..qb-4");
    for ordinal in 2..5 {
        assert_eq!(
            admin.permission(&addr(ordinal)),
            Some(BrokerPermission::ReadOnly)
        );
    }
    assert_eq!(
        stored_broker(&api).status.unwrap().read_only_brokers,
        vec!["qb-2", "qb-3", "qb-4"]
    );

    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 3.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("partial revert");
    assert_eq!(
        admin.permission(&addr(2)),
        Some(BrokerPermission::ReadWrite),
        "qb-2 stays, so it takes writes again"
    );
    assert_eq!(admin.permission(&addr(3)), Some(BrokerPermission::ReadOnly));
    assert_eq!(admin.permission(&addr(4)), Some(BrokerPermission::ReadOnly));
    assert_eq!(
        sts_replicas(&api),
        5,
        "qb-3 and qb-4 still hold unread messages"
    );
    let status = stored_broker(&api).status.unwrap();
    let drain = status.drain.expect("still draining");
    assert_eq!(drain.brokers, vec!["qb-3", "qb-4"]);
    assert_eq!(drain.remaining_messages, 120);
    assert_eq!(status.read_only_brokers, vec!["qb-3", "qb-4"]);
    assert!(api.event_reasons().contains(&"DrainCancelled".to_string()));
    let config = api.get(&paths::config_map("qb-config")).unwrap();
    let kept: serde_json::Value =
        serde_json::from_str(config["data"]["qb-2.json"].as_str().unwrap()).unwrap();
    assert!(
        kept.get("broker-permission").is_none(),
        "a restart keeps qb-2 writable"
    );

    admin.consume_all(&addr(3), "billing");
    admin.consume_all(&addr(4), "billing");
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("drained");
    assert_eq!(sts_replicas(&api), 3);
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(status.drain, None);
    assert!(status.read_only_brokers.is_empty());
}

#[tokio::test]
async fn a_kept_broker_that_does_not_answer_is_retried_and_reported() {
    let (api, admin, ctx) = settled_brokers(3).await;
    admin.set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 2.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("drains qb-2");
    admin.make_unreachable(&addr(2));
    api.edit(&paths::broker("qb"), |broker| {
        broker["spec"]["replicas"] = 3.into()
    });
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("the failed restore does not fail the pass");
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        status.read_only_brokers,
        vec!["qb-2"],
        "remembered for the next pass"
    );
    assert_eq!(
        super::condition(&status.conditions, "Degraded"),
        ("True".into(), "KeptBrokerReadOnly".into())
    );
    admin.make_reachable(&addr(2));
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("restores");
    assert_eq!(
        admin.permission(&addr(2)),
        Some(BrokerPermission::ReadWrite)
    );
    let status = stored_broker(&api).status.unwrap();
    assert!(status.read_only_brokers.is_empty());
    assert_eq!(super::condition(&status.conditions, "Degraded").0, "False");
}
