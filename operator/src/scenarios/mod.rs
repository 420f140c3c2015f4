//! Controller scenarios against the fake API server and the in-memory brokers, one behaviour
//! per file (the controller-rs fixtures pattern).

mod api_errors;
mod broker_create;
mod broker_disk_pressure;
mod broker_drain_forced;
mod broker_drain_partial_revert;
mod broker_drain_topics_without_group;
mod broker_expansion_refused;
mod broker_pause;
mod broker_rbac;
mod broker_rollout;
mod broker_rollout_stuck;
mod broker_scale_down;
mod broker_storm;
mod broker_volume_expansion;
mod group_failover;
mod group_finalizer;
mod group_lag_partial;
mod group_lag_status;
mod group_no_storm;
mod group_offset_reset;
mod group_poll_failure;
mod group_progress;
mod group_storm;
mod group_support;

use crate::controller::Context;
use crate::crd::{Broker, ConsumerGroup};
use crate::fixtures::{paths, FakeAdmin, FakeApiServer};
use kube::Client;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

/// The fixed "now" of every scenario, ms since the epoch.
pub const NOW_MS: i64 = 1_700_000_000_000;

fn fixed_clock() -> i64 {
    NOW_MS
}

/// Lag poll interval of the scenarios' context.
pub const LAG_INTERVAL: Duration = Duration::from_secs(15);

/// A context over `client` and `admin` with the fixed clock.
pub fn context(client: Client, admin: Arc<FakeAdmin>) -> Arc<Context> {
    Arc::new(Context::new(client, admin, Arc::default(), LAG_INTERVAL).with_clock(fixed_clock))
}

/// Remoting address of broker `ordinal` of Broker `qb` in `ns`.
pub fn addr(ordinal: i32) -> String {
    format!("qb-{ordinal}.qb-headless.ns.svc:10911")
}

/// The Broker as the API server holds it now.
pub fn stored_broker(api: &FakeApiServer) -> Broker {
    api.object(&paths::broker("qb"))
}

/// The ConsumerGroup as the API server holds it now.
pub fn stored_group(api: &FakeApiServer) -> ConsumerGroup {
    api.object(&paths::group("billing"))
}

/// Plays the StatefulSet controller: `ready` pods Ready, `updated` at the update revision,
/// status observed at the current generation.
pub fn settle_statefulset(api: &FakeApiServer, ready: i32, updated: i32) {
    let path = paths::statefulset("qb");
    let sts = api.get(&path).expect("statefulset exists");
    let generation = sts["metadata"]["generation"].as_i64().unwrap_or(1);
    let replicas = sts["spec"]["replicas"].as_i64().unwrap_or(0);
    api.set_status(
        &path,
        json!({
            "observedGeneration": generation,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
        }),
    );
}

/// Plays the StatefulSet controller's revisions: pods run `current`, the template is `update`.
pub fn set_revisions(api: &FakeApiServer, current: &str, update: &str) {
    api.edit(&paths::statefulset("qb"), |sts| {
        sts["status"]["currentRevision"] = current.into();
        sts["status"]["updateRevision"] = update.into();
    });
}

/// Plays the kubelet: pod `qb-<ordinal>` at `revision`, Ready or not.
pub fn set_pod(api: &FakeApiServer, ordinal: i32, revision: &str, ready: bool) {
    let name = format!("qb-{ordinal}");
    api.insert(
        &paths::pod(&name),
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "labels": {
                "app.kubernetes.io/name": "quiver-broker",
                "app.kubernetes.io/instance": "qb",
                "controller-revision-hash": revision,
            }},
            "status": {"conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]},
        }),
    );
}

/// A StorageClass, the cluster default or not, allowing volume expansion or not.
pub fn set_storage_class(api: &FakeApiServer, name: &str, default: bool, allow_expansion: bool) {
    let annotations = if default {
        json!({"storageclass.kubernetes.io/is-default-class": "true"})
    } else {
        json!({})
    };
    api.insert(
        &paths::storage_class(name),
        json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name, "annotations": annotations},
            "provisioner": "csi.example",
            "allowVolumeExpansion": allow_expansion,
        }),
    );
}

/// A condition's message.
pub fn condition_message(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> String {
    conditions
        .iter()
        .find(|condition| condition.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"))
        .message
        .clone()
}

/// A condition's status ("True"/"False"/"Unknown") and reason.
pub fn condition(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> (String, String) {
    let found = conditions
        .iter()
        .find(|condition| condition.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {conditions:?}"));
    (found.status.clone(), found.reason.clone())
}
