//! `kubectl scale broker qb --replicas N` and an HPA: the Broker's scale subresource reads and
//! writes spec.replicas; the operator scales as for any edit (a scale-down still drains first)
//! and the status carries the replicas and the pods' selector that the Scale reports.

use super::{addr, eventually, holds_for, Scenario};
use crate::crd::Broker;
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use std::time::Duration;

const SELECTOR: &str = "app.kubernetes.io/instance=qb,app.kubernetes.io/name=quiver-broker";

fn replicas(scale: &Scale) -> (Option<i32>, i32) {
    let spec = scale.spec.as_ref().and_then(|spec| spec.replicas);
    (
        spec,
        scale.status.as_ref().map_or(0, |status| status.replicas),
    )
}

#[tokio::test(start_paused = true)]
async fn the_scale_subresource_scales_the_broker_and_a_scale_down_still_drains() {
    let scenario = Scenario::settled(2).await;
    let brokers: Api<Broker> = Api::namespaced(scenario.ctx.client.clone(), "ns");
    let read = brokers.get_scale("qb").await.expect("a scale subresource");
    assert_eq!(replicas(&read), (Some(2), 2));
    let selector = read
        .status
        .as_ref()
        .and_then(|status| status.selector.clone());
    assert_eq!(selector.as_deref(), Some(SELECTOR));
    let pods: Api<Pod> = Api::namespaced(scenario.ctx.client.clone(), "ns");
    let selected = pods
        .list(&ListParams::default().labels(SELECTOR))
        .await
        .expect("pods listed");
    assert_eq!(
        selected.items.len(),
        2,
        "the selector selects the Broker's pods"
    );

    // An HPA scales up: a PUT of the Scale it read, under its own field manager, read again
    // when the operator's status write got in between (409), as the HPA controller does.
    let hpa = PostParams {
        field_manager: Some("horizontal-pod-autoscaler".into()),
        ..PostParams::default()
    };
    let mut attempts = 0;
    loop {
        let current = brokers.get_scale("qb").await.expect("scale");
        let wanted = Scale {
            spec: Some(ScaleSpec { replicas: Some(3) }),
            ..current
        };
        match brokers.replace_scale("qb", &hpa, &wanted).await {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 && attempts < 5 => attempts += 1,
            Err(error) => panic!("the HPA's scale-up was refused: {error:?}"),
        }
    }
    eventually(Duration::from_secs(900), || {
        scenario.pods_ready_on(3, "quiver:1") && scenario.broker_ready()
    })
    .await;
    let broker = scenario.broker();
    assert_eq!(broker.spec.replicas, 3);
    let managers: Vec<String> = broker
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|entry| entry.manager)
        .collect();
    assert!(
        managers.iter().any(|m| m == "horizontal-pod-autoscaler"),
        "{managers:?}"
    );
    let scaled = brokers.get_scale("qb").await.expect("scale");
    assert_eq!(replicas(&scaled), (Some(3), 3));

    // kubectl scale down while qb-2 holds unread messages: the drain keeps it.
    scenario
        .admin
        .set_queue(&addr(2), "billing", ("orders", 0), 100, Some(40), None);
    let down = serde_json::json!({"spec": {"replicas": 2}});
    brokers
        .patch_scale("qb", &PatchParams::default(), &Patch::Merge(&down))
        .await
        .expect("scaled down");
    eventually(Duration::from_secs(60), || {
        scenario.status().drain.is_some()
    })
    .await;
    holds_for(
        Duration::from_secs(120),
        "qb-2 kept and counted while it drains",
        || scenario.sts_replicas() == 3 && scenario.status().replicas == 3,
    )
    .await;
    let draining = brokers.get_scale("qb").await.expect("scale");
    assert_eq!(replicas(&draining), (Some(2), 3));

    scenario.admin.consume_all(&addr(2), "billing");
    eventually(Duration::from_secs(900), || {
        scenario.sts_replicas() == 2
            && scenario.pods_ready_on(2, "quiver:1")
            && scenario.broker_ready()
    })
    .await;
    scenario.event("Drained", "Normal");
    let done = brokers.get_scale("qb").await.expect("scale");
    assert_eq!(replicas(&done), (Some(2), 2));
    scenario.stop().await;
}
