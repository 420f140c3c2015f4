//! No reconcile storm: the operator's own status writes pass no watch filter, and a pass that
//! changes nothing a user reads writes no status at all.

use super::{context, settle_statefulset, stored_broker};
use crate::controller::broker::reconcile;
use crate::controller::reconcile_trigger;
use crate::crd::{Broker, FORCE_SCALE_DOWN_ANNOTATION, PAUSE_ANNOTATION};
use crate::fixtures::{paths, BrokerFixture, FakeAdmin, FakeApiServer};
use std::sync::Arc;

fn status_writes(api: &FakeApiServer) -> usize {
    let status_path = format!("PATCH {}/status", paths::broker("qb"));
    api.requests()
        .iter()
        .filter(|request| **request == status_path)
        .count()
}

#[tokio::test]
async fn a_settled_broker_is_reconciled_without_writing_its_status() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let broker = Broker::test().replicas(3);
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker), ctx.clone())
        .await
        .expect("creates");
    settle_statefulset(&api, 3, 3);
    reconcile(Arc::new(stored_broker(&api)), ctx.clone())
        .await
        .expect("settles");
    api.clear_requests();
    for _ in 0..5 {
        reconcile(Arc::new(stored_broker(&api)), ctx.clone())
            .await
            .expect("idle pass");
    }
    assert_eq!(status_writes(&api), 0, "{:?}", api.requests());
    assert!(api.event_reasons().is_empty(), "{:?}", api.event_reasons());
}

#[tokio::test]
async fn the_watch_filter_passes_spec_and_metadata_changes_but_not_status() {
    let (client, api) = FakeApiServer::start();
    let ctx = context(client, Arc::new(FakeAdmin::default()));
    let broker = Broker::test().replicas(3);
    api.insert(&paths::broker("qb"), &broker);
    reconcile(Arc::new(broker.clone()), ctx)
        .await
        .expect("creates");
    let written = stored_broker(&api);
    assert!(written.status.is_some());
    assert_eq!(
        reconcile_trigger(&written),
        reconcile_trigger(&broker),
        "our own status write does not wake the next reconcile"
    );
    let mut new_generation = broker.clone();
    new_generation.metadata.generation = Some(2);
    let annotated = |key: &str| {
        let mut changed = broker.clone();
        changed.metadata.annotations = Some([(key.to_string(), "true".to_string())].into());
        changed
    };
    let mut finalized = broker.clone();
    finalized.metadata.finalizers = Some(vec!["example.com/keep".to_string()]);
    let mut deleted = broker.clone();
    deleted.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap(),
        ));
    let mut labelled = broker.clone();
    labelled.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    for changed in [
        new_generation,
        annotated(PAUSE_ANNOTATION),
        annotated(FORCE_SCALE_DOWN_ANNOTATION),
        finalized,
        deleted,
        labelled,
    ] {
        assert_ne!(
            reconcile_trigger(&changed),
            reconcile_trigger(&broker),
            "{:?}",
            changed.metadata
        );
    }
}
