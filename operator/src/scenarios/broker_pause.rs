//! The pause annotation stops reconciliation and says so in a condition.

use super::{condition, context, stored_broker};
use crate::controller::broker::reconcile;
use crate::crd::Broker;
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use kube::runtime::controller::Action;
use std::sync::Arc;

#[tokio::test]
async fn paused_broker_is_left_alone() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let broker = Broker::test().replicas(3).paused();
    api.insert(&paths::broker("qb"), &broker);

    let action = reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(action, Action::await_change());
    assert!(
        api.get(&paths::statefulset("qb")).is_none(),
        "nothing applied while paused"
    );
    let patched: Vec<String> = api
        .requests()
        .into_iter()
        .filter(|r| r.starts_with("PATCH"))
        .collect();
    assert_eq!(
        patched,
        vec![format!("PATCH {}/status", paths::broker("qb"))]
    );
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(
        condition(&status.conditions, "Paused"),
        ("True".into(), "PauseAnnotation".into())
    );
    assert_eq!(
        condition(&status.conditions, "Progressing"),
        ("False".into(), "Paused".into())
    );
    assert_eq!(api.event_reasons(), vec!["Paused"]);

    // A second pass while paused publishes no second event.
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("reconciles");
    assert_eq!(api.event_reasons(), vec!["Paused"]);

    // Removing the annotation resumes.
    api.edit(&paths::broker("qb"), |broker| {
        broker["metadata"]["annotations"] = serde_json::json!({});
    });
    reconcile(Arc::new(stored_broker(&api)), ctx)
        .await
        .expect("reconciles");
    assert!(api.get(&paths::statefulset("qb")).is_some());
    let status = stored_broker(&api).status.unwrap();
    assert_eq!(condition(&status.conditions, "Paused").0, "False");
}
