//! No reconcile storm: a settled Broker under the real controller, over ten idle simulated
//! minutes, is reconciled only on its idle requeue and never has its status written; the watch
//! filter passes spec and metadata changes but not the operator's own status writes.

use super::Scenario;
use crate::controller::broker::IDLE_REQUEUE;
use crate::controller::reconcile_trigger;
use crate::crd::{Broker, FORCE_SCALE_DOWN_ANNOTATION, PAUSE_ANNOTATION};
use crate::fixtures::BrokerFixture;
use std::time::Duration;

const TEN_MINUTES: Duration = Duration::from_secs(600);

#[tokio::test(start_paused = true)]
async fn a_settled_broker_is_reconciled_on_its_idle_requeue_only_and_never_written() {
    let scenario = Scenario::settled(3).await;
    // Let the last status write and the pods' last changes come back through the watches.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let reconciles_before = scenario.reconciles();
    let writes = || {
        scenario
            .server
            .request_count("patch", "brokers", "qb", "status")
    };
    let writes_before = writes();

    tokio::time::sleep(TEN_MINUTES).await;
    // Nothing changes, so only the idle requeue (every 300 s) wakes the Broker: two in ten
    // minutes, one more if the last settling pass was just before the window.
    let requeues = (TEN_MINUTES.as_secs() / IDLE_REQUEUE.as_secs()) + 1;
    let reconciles = scenario.reconciles() - reconciles_before;
    assert!(
        (1..=requeues).contains(&reconciles),
        "{reconciles} reconciles in ten idle minutes"
    );
    assert_eq!(writes() - writes_before, 0, "an idle pass writes no status");
    assert!(scenario.broker_ready());
    scenario.stop().await;
}

#[test]
fn the_watch_filter_passes_spec_and_metadata_changes_but_not_status() {
    let broker = Broker::test().replicas(3);
    let mut written = broker.clone();
    written.status = Some(crate::crd::BrokerStatus {
        ready_replicas: 3,
        ..Default::default()
    });
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
