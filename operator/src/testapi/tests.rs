//! Unit tests of the test API server, through a real `kube::Client` over its in-process
//! transport.

use super::admission::RESIZE_FORBIDDEN;
use super::{PodBehaviour, TestApiServer};
use crate::crd::Broker;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use kube::api::{
    DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::{Api, ResourceExt};
use serde_json::{json, Value};
use std::time::Duration;

fn config_map(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ns"}, "data": data,
    }))
    .expect("config map")
}

fn broker(spec: Value) -> Value {
    json!({
        "apiVersion": "quiver.io/v1alpha1", "kind": "Broker",
        "metadata": {"name": "qb", "namespace": "ns"}, "spec": spec,
    })
}

fn api_error(error: kube::Error) -> kube::core::Status {
    match error {
        kube::Error::Api(status) => *status,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn create_broker(server: &TestApiServer, spec: Value) -> Broker {
    let brokers: Api<Broker> = Api::namespaced(server.client(), "ns");
    let broker: Broker = serde_json::from_value(broker(spec)).expect("broker parses");
    brokers
        .create(&PostParams::default(), &broker)
        .await
        .expect("broker created")
}

#[tokio::test(start_paused = true)]
async fn watch_resumes_from_a_resource_version_sends_bookmarks_and_times_out() {
    let server = TestApiServer::start().await;
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
    let post = PostParams::default();
    let a = maps
        .create(&post, &config_map("a", json!({"k": "1"})))
        .await
        .unwrap();
    maps.create(&post, &config_map("b", json!({})))
        .await
        .unwrap();
    let merge = Patch::Merge(json!({"data": {"k": "2"}}));
    maps.patch("a", &PatchParams::default(), &merge)
        .await
        .unwrap();

    let since = a.resource_version().expect("rv set");
    let params = WatchParams::default().timeout(120);
    let mut events = maps.watch(&params, &since).await.unwrap().boxed();
    let started = tokio::time::Instant::now();
    assert!(
        matches!(events.try_next().await.expect("event parses"), Some(WatchEvent::Added(map)) if map.name_any() == "b")
    );
    assert!(
        matches!(events.try_next().await.expect("event parses"), Some(WatchEvent::Modified(map)) if map.name_any() == "a")
    );
    let c = maps
        .create(&post, &config_map("c", json!({})))
        .await
        .unwrap();
    assert!(
        matches!(events.try_next().await.expect("event parses"), Some(WatchEvent::Added(map)) if map.name_any() == "c")
    );
    let Some(WatchEvent::Bookmark(bookmark)) = events.try_next().await.expect("event parses")
    else {
        panic!("a bookmark after a quiet minute")
    };
    let rv = |text: &str| text.parse::<u64>().unwrap();
    assert!(rv(&bookmark.metadata.resource_version) >= rv(&c.resource_version().unwrap()));
    while let Some(event) = events.try_next().await.expect("event parses") {
        assert!(matches!(event, WatchEvent::Bookmark(_)), "{event:?}");
    }
    assert!(
        started.elapsed() >= Duration::from_secs(120),
        "closed at timeoutSeconds"
    );

    server.set_history_limit(1);
    let mut expired = maps.watch(&params, &since).await.unwrap().boxed();
    match expired.try_next().await.expect("event parses") {
        Some(WatchEvent::Error(status)) => {
            assert_eq!((status.code, status.reason.as_str()), (410, "Expired"))
        }
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

#[tokio::test]
async fn lists_filter_by_label_and_span_namespaces() {
    let server = TestApiServer::start().await;
    for (namespace, name, tier) in [
        ("a", "one", "front"),
        ("b", "two", "front"),
        ("b", "three", "back"),
    ] {
        let map = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": {"tier": tier}}});
        server.insert(&map);
    }
    let all: Api<ConfigMap> = Api::all(server.client());
    let front = all
        .list(&ListParams::default().labels("tier=front"))
        .await
        .unwrap();
    let names: Vec<String> = front.items.iter().map(ResourceExt::name_any).collect();
    assert_eq!(names, ["one", "two"]);
    let in_b: Api<ConfigMap> = Api::namespaced(server.client(), "b");
    let not_front = in_b
        .list(&ListParams::default().labels("tier!=front"))
        .await
        .unwrap();
    assert_eq!(not_front.items.len(), 1);
    assert_eq!(
        front.metadata.resource_version,
        Some(server.resource_version().to_string())
    );
}

#[tokio::test]
async fn generation_moves_only_with_the_spec_and_no_op_writes_change_nothing() {
    let server = TestApiServer::start().await;
    let brokers: Api<Broker> = Api::namespaced(server.client(), "ns");
    let created = create_broker(&server, json!({"replicas": 1, "storage": {"size": "10Gi"}})).await;
    assert_eq!(created.metadata.generation, Some(1));
    assert!(created.uid().is_some() && created.creation_timestamp().is_some());
    let labels = Patch::Merge(json!({"metadata": {"labels": {"team": "mq"}}}));
    let labelled = brokers
        .patch("qb", &PatchParams::default(), &labels)
        .await
        .unwrap();
    assert_eq!(
        labelled.metadata.generation,
        Some(1),
        "metadata is not spec"
    );
    assert_ne!(labelled.resource_version(), created.resource_version());
    let status = Patch::Merge(json!({"status": {"readyReplicas": 1}}));
    let with_status = brokers
        .patch_status("qb", &PatchParams::default(), &status)
        .await
        .unwrap();
    assert_eq!(
        with_status.metadata.generation,
        Some(1),
        "status is not spec"
    );
    let spec = Patch::Merge(json!({"spec": {"replicas": 2}}));
    let scaled = brokers
        .patch("qb", &PatchParams::default(), &spec)
        .await
        .unwrap();
    assert_eq!(scaled.metadata.generation, Some(2));
    let again = brokers
        .patch("qb", &PatchParams::default(), &spec)
        .await
        .unwrap();
    assert_eq!(
        again.resource_version(),
        scaled.resource_version(),
        "a no-op write is not stored"
    );
}

#[tokio::test]
async fn the_status_subresource_isolates_status_from_the_rest() {
    let server = TestApiServer::start().await;
    let brokers: Api<Broker> = Api::namespaced(server.client(), "ns");
    let mut manifest = broker(json!({"replicas": 1, "storage": {"size": "10Gi"}}));
    manifest["status"] = json!({"readyReplicas": 7});
    let typed: Broker = serde_json::from_value(manifest).unwrap();
    let created = brokers
        .create(&PostParams::default(), &typed)
        .await
        .unwrap();
    assert!(created.status.is_none(), "status is dropped on create");
    let both = json!({"spec": {"replicas": 3}, "status": {"readyReplicas": 5}});
    let main = brokers
        .patch("qb", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .unwrap();
    assert_eq!(main.spec.replicas, 3);
    assert!(main.status.is_none(), "the main resource ignores status");
    let sub = brokers
        .patch_status("qb", &PatchParams::default(), &Patch::Merge(&both))
        .await
        .unwrap();
    assert_eq!(sub.status.unwrap().ready_replicas, 5);
    let stored: Broker = server.object("ns", "qb").unwrap();
    assert_eq!(
        stored.spec.replicas, 3,
        "the status subresource ignores spec"
    );
}

#[tokio::test]
async fn server_side_apply_tracks_owners_and_conflicts_unless_forced() {
    let server = TestApiServer::start().await;
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
    let apply = |data: Value| Patch::Apply(config_map("cfg", data));
    maps.patch(
        "cfg",
        &PatchParams::apply("alice"),
        &apply(json!({"k": "a", "x": "1", "y": "2"})),
    )
    .await
    .unwrap();
    let error = maps
        .patch("cfg", &PatchParams::apply("bob"), &apply(json!({"k": "b"})))
        .await
        .unwrap_err();
    let status = api_error(error);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("conflict with \"alice\": .data.k"),
        "{}",
        status.message
    );
    maps.patch("cfg", &PatchParams::apply("bob"), &apply(json!({"k": "a"})))
        .await
        .expect("the same value is shared, not a conflict");
    let forced = maps
        .patch(
            "cfg",
            &PatchParams::apply("bob").force(),
            &apply(json!({"k": "b"})),
        )
        .await
        .expect("force takes the field");
    assert_eq!(forced.data.unwrap()["k"], "b");
    let managers: Vec<String> = forced
        .metadata
        .managed_fields
        .unwrap()
        .iter()
        .filter_map(|entry| entry.manager.clone())
        .collect();
    assert_eq!(managers, ["alice", "bob"]);
    let alice_again = maps
        .patch(
            "cfg",
            &PatchParams::apply("alice"),
            &apply(json!({"x": "1"})),
        )
        .await
        .expect("alice no longer owns k");
    let data = alice_again.data.unwrap();
    assert_eq!(
        data.get("k").map(String::as_str),
        Some("b"),
        "bob's field stays"
    );
    assert!(
        !data.contains_key("y"),
        "a field alice alone stopped applying is removed"
    );
    let missing_manager = PatchParams {
        field_manager: None,
        ..PatchParams::apply("x")
    };
    let error = maps
        .patch("cfg", &missing_manager, &apply(json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(error).code, 400);
}

#[tokio::test]
async fn merge_and_json_patches_apply_and_a_failed_test_is_invalid() {
    let server = TestApiServer::start().await;
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
    maps.create(
        &PostParams::default(),
        &config_map("cfg", json!({"a": "1", "b": "1"})),
    )
    .await
    .unwrap();
    let merge = Patch::Merge(json!({"data": {"a": null, "b": "2"}}));
    let merged = maps
        .patch("cfg", &PatchParams::default(), &merge)
        .await
        .unwrap();
    assert_eq!(
        merged.data.clone().unwrap(),
        [("b".to_string(), "2".to_string())].into()
    );
    let operations: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/data/b", "value": "2"},
        {"op": "add", "path": "/data/c", "value": "3"},
    ]))
    .unwrap();
    let patched = maps
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::<()>::Json(operations),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["c"], "3");
    let failing: json_patch::Patch =
        serde_json::from_value(json!([{"op": "test", "path": "/data/b", "value": "9"}])).unwrap();
    let error = maps
        .patch("cfg", &PatchParams::default(), &Patch::<()>::Json(failing))
        .await
        .unwrap_err();
    assert_eq!(api_error(error).code, 422);
    // As kube-runtime's finalizer helper sends it: a test for null at a missing path passes.
    let add_finalizer: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/finalizers", "value": null},
        {"op": "add", "path": "/metadata/finalizers", "value": ["quiver.io/x"]},
    ]))
    .unwrap();
    let held = maps
        .patch(
            "cfg",
            &PatchParams::default(),
            &Patch::<()>::Json(add_finalizer),
        )
        .await
        .unwrap();
    assert_eq!(held.finalizers(), ["quiver.io/x"]);
    let strategic = Patch::Strategic(json!({"data": {"d": "4"}}));
    let patched = maps
        .patch("cfg", &PatchParams::default(), &strategic)
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["d"], "4");
}

#[tokio::test]
async fn replace_with_a_stale_resource_version_conflicts_and_create_twice_exists() {
    let server = TestApiServer::start().await;
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
    let first = maps
        .create(
            &PostParams::default(),
            &config_map("cfg", json!({"a": "1"})),
        )
        .await
        .unwrap();
    let error = maps
        .create(&PostParams::default(), &config_map("cfg", json!({})))
        .await
        .unwrap_err();
    assert_eq!(api_error(error).reason, "AlreadyExists");
    let mut newer = first.clone();
    newer.data = Some([("a".to_string(), "2".to_string())].into());
    let newer = maps
        .replace("cfg", &PostParams::default(), &newer)
        .await
        .unwrap();
    let mut stale = first;
    stale.data = Some([("a".to_string(), "3".to_string())].into());
    let error = maps
        .replace("cfg", &PostParams::default(), &stale)
        .await
        .unwrap_err();
    let status = api_error(error);
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(status.message.contains("the object has been modified"));
    assert_eq!(
        server.object::<ConfigMap>("ns", "cfg").unwrap().data,
        newer.data
    );

    let brokers: Api<Broker> = Api::namespaced(server.client(), "ns");
    let mut broker =
        create_broker(&server, json!({"replicas": 1, "storage": {"size": "1Gi"}})).await;
    broker.metadata.resource_version = None;
    let error = brokers
        .replace("qb", &PostParams::default(), &broker)
        .await
        .unwrap_err();
    assert_eq!(
        api_error(error).code,
        422,
        "custom resources need a resourceVersion to update"
    );
}

#[tokio::test]
async fn finalizers_hold_a_deleted_object_until_they_are_removed() {
    let server = TestApiServer::start().await;
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
    let mut held = config_map("held", json!({}));
    held.metadata.finalizers = Some(vec!["quiver.io/test".into()]);
    maps.create(&PostParams::default(), &held).await.unwrap();
    maps.delete("held", &DeleteParams::default()).await.unwrap();
    let deleting = server
        .object::<ConfigMap>("ns", "held")
        .expect("still there");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    assert_eq!(
        deleting.metadata.generation, None,
        "config maps have no generation"
    );
    let release = Patch::Merge(json!({"metadata": {"finalizers": null}}));
    maps.patch("held", &PatchParams::default(), &release)
        .await
        .unwrap();
    assert!(
        server.object::<ConfigMap>("ns", "held").is_none(),
        "gone with the last finalizer"
    );
    let error = maps.get("held").await.unwrap_err();
    assert_eq!(api_error(error).code, 404);
}

fn owned_by(name: &str, kind: &str, owners: &[&Value]) -> Value {
    let references: Vec<Value> = owners
        .iter()
        .map(|owner| {
            json!({"apiVersion": owner["apiVersion"], "kind": owner["kind"],
            "name": owner["metadata"]["name"], "uid": owner["metadata"]["uid"]})
        })
        .collect();
    json!({"apiVersion": "v1", "kind": kind,
        "metadata": {"name": name, "namespace": "ns", "ownerReferences": references},
        "spec": {"containers": [{"name": "c", "image": "i"}]}})
}

#[tokio::test]
async fn deleting_an_owner_collects_its_dependents_in_cascade() {
    let server = TestApiServer::start().await;
    let owner = server.insert(&broker(json!({"replicas": 1, "storage": {"size": "1Gi"}})));
    let other = server.insert(&config_map("other", json!({})));
    let child = server.insert(&owned_by("child", "ConfigMap", &[&owner]));
    server.insert(&owned_by("grandchild", "Pod", &[&child]));
    server.insert(&owned_by("shared", "ConfigMap", &[&owner, &other]));
    let mut held = owned_by("held", "ConfigMap", &[&owner]);
    held["metadata"]["finalizers"] = json!(["quiver.io/test"]);
    server.insert(&held);
    let brokers: Api<Broker> = Api::namespaced(server.client(), "ns");
    brokers
        .delete("qb", &DeleteParams::default())
        .await
        .unwrap();
    assert!(server.raw::<ConfigMap>("ns", "child").is_none());
    assert!(server.raw::<Pod>("ns", "grandchild").is_none(), "cascades");
    let shared = server
        .raw::<ConfigMap>("ns", "shared")
        .expect("a live owner keeps it");
    assert_eq!(
        shared["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    let held = server
        .raw::<ConfigMap>("ns", "held")
        .expect("finalizer holds it");
    assert!(!held["metadata"]["deletionTimestamp"].is_null());
}

#[tokio::test]
async fn cel_rules_reject_a_shrinking_broker_with_422_invalid() {
    let server = TestApiServer::start().await;
    let brokers: Api<Broker> = Api::namespaced(server.client(), "ns");
    create_broker(&server, json!({"replicas": 1, "storage": {"size": "10Gi"}})).await;
    let shrink = Patch::Merge(json!({"spec": {"storage": {"size": "5Gi"}}}));
    let status = api_error(
        brokers
            .patch("qb", &PatchParams::default(), &shrink)
            .await
            .unwrap_err(),
    );
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(
        status
            .message
            .starts_with("Broker.quiver.io \"qb\" is invalid: spec.storage.size"),
        "{}",
        status.message
    );
    assert!(
        status.message.contains("storage size may only grow"),
        "{}",
        status.message
    );
    let grow = Patch::Merge(json!({"spec": {"storage": {"size": "20Gi"}}}));
    brokers
        .patch("qb", &PatchParams::default(), &grow)
        .await
        .expect("growth is allowed");
    let zero = Patch::Merge(json!({"spec": {"replicas": 0}}));
    let status = api_error(
        brokers
            .patch("qb", &PatchParams::default(), &zero)
            .await
            .unwrap_err(),
    );
    assert!(
        status.message.contains("replicas must be at least 1"),
        "{}",
        status.message
    );
}

#[tokio::test]
async fn the_openapi_schema_types_requires_enums_prunes_and_defaults() {
    let server = TestApiServer::start().await;
    let rejected = |spec: Value| server.try_insert(&broker(spec)).unwrap_err();
    let wrong_type = rejected(json!({"replicas": "three", "storage": {"size": "1Gi"}}));
    assert!(
        wrong_type
            .message
            .contains("spec.replicas in body must be of type integer"),
        "{}",
        wrong_type.message
    );
    let missing = rejected(json!({"replicas": 1}));
    assert!(
        missing.message.contains("spec.storage: Required value"),
        "{}",
        missing.message
    );
    let enum_value =
        rejected(json!({"replicas": 1, "storage": {"size": "1Gi"}, "flushDiskType": "FAST"}));
    assert!(
        enum_value.message.contains("Unsupported value: \"FAST\""),
        "{}",
        enum_value.message
    );
    let too_high = rejected(json!({"replicas": 1, "storage": {"size": "1Gi"},
        "retention": {"fileReservedHours": 1, "diskHighWaterPercent": 300}}));
    assert_eq!(too_high.code, 422, "{}", too_high.message);
    let stored = server.insert(&broker(
        json!({"replicas": 1, "storage": {"size": "1Gi"}, "bogus": true}),
    ));
    assert!(
        stored["spec"].get("bogus").is_none(),
        "unknown fields are pruned"
    );
    assert_eq!(
        stored["spec"]["flushDiskType"], "ASYNC",
        "schema defaults are applied"
    );
}

/// The clock is simulated only if a request and a watch event cost no simulated time: the
/// paused clock may move only when every task waits on a timer (module docs, "Transport").
#[tokio::test(start_paused = true)]
async fn requests_and_watch_events_cost_no_simulated_time() {
    let server = TestApiServer::start().await;
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
    let started = tokio::time::Instant::now();
    let params = WatchParams::default().timeout(30).disable_bookmarks();
    let mut events = maps.watch(&params, "0").await.unwrap().boxed();
    let post = PostParams::default();
    for index in 0..50 {
        let name = format!("m{index}");
        maps.create(&post, &config_map(&name, json!({"k": "1"})))
            .await
            .unwrap();
        let merge = Patch::Merge(json!({"data": {"k": "2"}}));
        maps.patch(&name, &PatchParams::default(), &merge)
            .await
            .unwrap();
        maps.get(&name).await.unwrap();
        for expected in ["ADDED", "MODIFIED"] {
            let event = events.try_next().await.unwrap().expect("an event");
            let kind = match event {
                WatchEvent::Added(_) => "ADDED",
                WatchEvent::Modified(_) => "MODIFIED",
                other => panic!("unexpected {other:?}"),
            };
            assert_eq!(kind, expected);
        }
    }
    assert_eq!(
        maps.list(&ListParams::default()).await.unwrap().items.len(),
        50
    );
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "150 requests and 100 watch events moved the simulated clock"
    );
    // With nothing in flight, the clock runs to the next timer: the watch's end.
    let end = events.try_next().await.unwrap();
    assert!(end.is_none(), "the watch ends at its timeout: {end:?}");
    assert_eq!(started.elapsed(), Duration::from_secs(30));
}

#[tokio::test]
async fn injected_failures_and_request_counts() {
    let server = TestApiServer::start().await;
    let maps: Api<ConfigMap> = Api::namespaced(server.client(), "ns");
    server.insert(&config_map("cfg", json!({})));
    server.fail_next(
        http::Method::GET,
        "/api/v1/namespaces/ns/configmaps/cfg",
        2,
        500,
    );
    for _ in 0..2 {
        assert_eq!(api_error(maps.get("cfg").await.unwrap_err()).code, 500);
    }
    maps.get("cfg").await.expect("the third answers");
    assert_eq!(server.request_count("get", "configmaps", "cfg", ""), 3);
    // kube-rs retries 503 on its own: one call, two requests.
    let path = "/api/v1/namespaces/ns/configmaps/cfg";
    server.fail_next(http::Method::GET, path, 1, 503);
    maps.get("cfg").await.expect("retried after the 503");
    assert_eq!(server.request_count("get", "configmaps", "cfg", ""), 5);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(server.client(), "ns");
    let event = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
        "metadata": {"name": "e1", "namespace": "ns"}, "reason": "Tested", "eventTime": "2023-11-14T22:13:20.000000Z"});
    events
        .create(
            &PostParams::default(),
            &serde_json::from_value(event).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(server.event_reasons(), ["Tested"]);
}

fn statefulset(replicas: i32, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {
            "replicas": replicas, "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            "template": {"metadata": {"labels": {"app": "web"}},
                         "spec": {"containers": [{"name": "web", "image": image}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}],
        },
    })
}

fn set_image(server: &TestApiServer, image: &str) {
    server.edit::<StatefulSet>("ns", "web", |sts| {
        sts["spec"]["template"]["spec"]["containers"][0]["image"] = image.into();
    });
}

/// Steps until every pod runs `image` and is Ready; the images seen at each step.
fn step_until_all(
    server: &TestApiServer,
    image: &str,
    limit: usize,
) -> Vec<Vec<(String, String, bool)>> {
    let mut history = Vec::new();
    for _ in 0..limit {
        server.step();
        let now = server.pod_states("ns");
        history.push(now.clone());
        let replicas = server
            .object::<StatefulSet>("ns", "web")
            .unwrap()
            .spec
            .replicas
            .unwrap();
        if now.len() == replicas as usize && now.iter().all(|(_, i, ready)| i == image && *ready) {
            return history;
        }
    }
    panic!(
        "not all pods at {image} after {limit} steps: {:?}",
        server.pod_states("ns")
    );
}

#[tokio::test]
async fn the_statefulset_simulation_creates_in_order_and_rolls_one_pod_at_a_time() {
    let server = TestApiServer::start().await;
    server.insert(&statefulset(3, "web:1"));
    let startup = step_until_all(&server, "web:1", 20);
    // OrderedReady: a pod is created only once every lower ordinal is Ready.
    for snapshot in &startup {
        let not_ready = snapshot.iter().filter(|(_, _, ready)| !ready).count();
        assert!(not_ready <= 1, "{snapshot:?}");
    }
    assert_eq!(server.list::<PersistentVolumeClaim>("ns").len(), 3);

    server.step();
    set_image(&server, "web:2");
    let rollout = step_until_all(&server, "web:2", 40);
    let mut order = Vec::new();
    for snapshot in &rollout {
        let unavailable = 3 - snapshot.iter().filter(|(_, _, ready)| *ready).count();
        assert!(unavailable <= 1, "one pod at a time: {snapshot:?}");
        for (name, image, _) in snapshot {
            if image == "web:2" && !order.contains(name) {
                order.push(name.clone());
            }
        }
    }
    // Any order the partition allows: this simulator goes lowest first, so a highest-first
    // rollout is the operator's partition, never the simulator's doing.
    assert_eq!(order, ["web-0", "web-1", "web-2"], "lowest ordinal first");
    server.step(); // the controller sees the last pod Ready one pass after the kubelet
    let status = server
        .object::<StatefulSet>("ns", "web")
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.current_revision, status.update_revision);
    assert_eq!(
        (status.ready_replicas, status.updated_replicas),
        (Some(3), Some(3))
    );

    server.edit::<StatefulSet>("ns", "web", |sts| {
        sts["spec"]["updateStrategy"]["rollingUpdate"]["partition"] = 2.into();
        sts["spec"]["template"]["spec"]["containers"][0]["image"] = "web:3".into();
    });
    for _ in 0..10 {
        server.step();
    }
    let images: Vec<String> = server
        .pod_states("ns")
        .into_iter()
        .map(|(_, image, _)| image)
        .collect();
    assert_eq!(
        images,
        ["web:2", "web:2", "web:3"],
        "only ordinals >= partition update"
    );

    server.edit::<StatefulSet>("ns", "web", |sts| sts["spec"]["replicas"] = 1.into());
    let mut terminating_at_once = 0;
    for _ in 0..20 {
        server.step();
        let terminating = server
            .list::<Pod>("ns")
            .iter()
            .filter(|pod| pod.metadata.deletion_timestamp.is_some())
            .count();
        terminating_at_once = terminating_at_once.max(terminating);
    }
    let names: Vec<String> = server
        .pod_states("ns")
        .into_iter()
        .map(|(name, _, _)| name)
        .collect();
    assert_eq!(names, ["web-0"]);
    assert_eq!(
        terminating_at_once, 1,
        "OrderedReady removes one pod at a time"
    );
    assert_eq!(
        server.list::<PersistentVolumeClaim>("ns").len(),
        3,
        "claims are retained"
    );
}

#[tokio::test]
async fn parallel_pod_management_creates_and_removes_every_pod_at_once() {
    let server = TestApiServer::start().await;
    let mut parallel = statefulset(3, "web:1");
    parallel["spec"]["podManagementPolicy"] = "Parallel".into();
    server.set_pod_behaviour("ns", "web-0", PodBehaviour::CrashLoop);
    server.insert(&parallel);
    server.step();
    assert_eq!(server.pod_states("ns").len(), 3, "all three in one pass");
    for _ in 0..3 {
        server.step();
    }
    let ready: Vec<bool> = server
        .pod_states("ns")
        .into_iter()
        .map(|(_, _, ready)| ready)
        .collect();
    assert_eq!(
        ready,
        [false, true, true],
        "web-0's crash holds back no other pod"
    );

    server.edit::<StatefulSet>("ns", "web", |sts| sts["spec"]["replicas"] = 1.into());
    server.step();
    let terminating: Vec<String> = server
        .list::<Pod>("ns")
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_some())
        .map(|pod| pod.name_any())
        .collect();
    assert_eq!(terminating, ["web-1", "web-2"]);
}

#[tokio::test]
async fn a_rolling_update_deletes_what_partition_and_max_unavailable_allow() {
    let server = TestApiServer::start().await;
    let mut sts = statefulset(4, "web:1");
    sts["spec"]["updateStrategy"]["rollingUpdate"] = json!({"partition": 1, "maxUnavailable": 2});
    server.insert(&sts);
    step_until_all(&server, "web:1", 30);
    server.step();
    set_image(&server, "web:2");
    server.step();
    let terminating: Vec<String> = server
        .list::<Pod>("ns")
        .into_iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_some())
        .map(|pod| pod.name_any())
        .collect();
    assert_eq!(
        terminating,
        ["web-1", "web-2"],
        "two at once, lowest first, none below the partition"
    );
    for _ in 0..20 {
        server.step();
    }
    let images: Vec<String> = server
        .pod_states("ns")
        .into_iter()
        .map(|(_, image, _)| image)
        .collect();
    assert_eq!(images, ["web:1", "web:2", "web:2", "web:2"]);
}

#[tokio::test]
async fn a_deleted_pod_terminates_until_its_kubelet_stops_it_or_its_grace_ends() {
    let server = TestApiServer::start().await;
    server.insert(&statefulset(2, "web:1"));
    step_until_all(&server, "web:1", 20);
    let uid = |name: &str| {
        server
            .object::<Pod>("ns", name)
            .and_then(|pod| pod.metadata.uid)
    };
    let first = uid("web-1").expect("running");

    let pods: Api<Pod> = Api::namespaced(server.client(), "ns");
    let deleted = pods
        .delete("web-1", &DeleteParams::default())
        .await
        .expect("deleted")
        .left()
        .expect("still there, terminating");
    assert_eq!(deleted.metadata.deletion_grace_period_seconds, Some(30));
    assert!(deleted.metadata.deletion_timestamp.is_some());
    server.step();
    let states = server.pod_states("ns");
    assert_eq!(
        states[1],
        ("web-1".into(), "web:1".into(), false),
        "not Ready"
    );
    assert_eq!(
        uid("web-1").as_deref(),
        Some(first.as_str()),
        "not replaced yet"
    );
    for _ in 0..super::statefulset::STOP_PASSES + 3 {
        server.step();
    }
    let second = uid("web-1").expect("recreated");
    assert_ne!(second, first, "gone once stopped, then created again");

    // With no grace period left the kubelet's next pass removes it, stopped or not.
    server.edit::<Pod>("ns", "web-0", |pod| {
        pod["spec"]["terminationGracePeriodSeconds"] = 0.into();
    });
    server.delete::<Pod>("ns", "web-0").expect("deleted");
    server.step();
    assert!(server
        .object::<Pod>("ns", "web-0")
        .is_none_or(|pod| pod.metadata.deletion_timestamp.is_none()));

    // A pod no kubelet runs yet goes at once.
    server.insert(&json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "loose", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}));
    server.delete::<Pod>("ns", "loose").expect("deleted");
    assert!(server.object::<Pod>("ns", "loose").is_none());
}

#[tokio::test]
async fn a_statefulset_created_again_adopts_the_pods_it_orphaned() {
    let server = TestApiServer::start().await;
    server.insert(&statefulset(2, "web:1"));
    step_until_all(&server, "web:1", 20);
    let uids = |server: &TestApiServer| -> Vec<Option<String>> {
        ["web-0", "web-1"]
            .iter()
            .map(|name| {
                server
                    .object::<Pod>("ns", name)
                    .and_then(|pod| pod.metadata.uid)
            })
            .collect()
    };
    let before = uids(&server);
    let statefulsets: Api<StatefulSet> = Api::namespaced(server.client(), "ns");
    statefulsets
        .delete("web", &DeleteParams::orphan())
        .await
        .expect("deleted");
    assert_eq!(uids(&server), before, "orphaned, not collected");
    let mut again = statefulset(2, "web:1");
    again["spec"]["podManagementPolicy"] = "Parallel".into();
    let created = server.insert(&again);
    for _ in 0..5 {
        server.step();
    }
    assert_eq!(uids(&server), before, "adopted, not replaced");
    for pod in server.list::<Pod>("ns") {
        let owners = pod.metadata.owner_references.unwrap_or_default();
        assert_eq!(owners.len(), 1, "{owners:?}");
        assert_eq!(owners[0].uid, created["metadata"]["uid"].as_str().unwrap());
    }
    let status = server
        .object::<StatefulSet>("ns", "web")
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.ready_replicas, Some(2));
}

#[tokio::test]
async fn a_crash_looping_pod_blocks_the_rollout_until_it_is_deleted() {
    let server = TestApiServer::start().await;
    server.insert(&statefulset(3, "web:1"));
    step_until_all(&server, "web:1", 20);
    server.set_image_behaviour("web:bad", PodBehaviour::CrashLoop);
    set_image(&server, "web:bad");
    for _ in 0..20 {
        server.step();
    }
    let stuck = server.pod_states("ns");
    assert_eq!(stuck[0].1, "web:bad");
    assert!(!stuck[0].2, "crash-looping");
    assert_eq!(
        (stuck[1].1.as_str(), stuck[2].1.as_str()),
        ("web:1", "web:1")
    );

    set_image(&server, "web:2");
    for _ in 0..20 {
        server.step();
    }
    assert_eq!(
        server.pod_states("ns"),
        stuck,
        "the fixed template does not replace the broken pod"
    );
    let status = server
        .object::<StatefulSet>("ns", "web")
        .unwrap()
        .status
        .unwrap();
    assert_eq!(status.ready_replicas, Some(2));

    server.delete::<Pod>("ns", "web-0").expect("pod deleted");
    step_until_all(&server, "web:2", 40);
}

#[tokio::test]
async fn claims_resize_only_when_the_storage_class_allows_expansion() {
    let server = TestApiServer::start().await;
    server.add_storage_class("fixed", false, true);
    server.add_storage_class("expandable", true, false);
    let claim = |name: &str, class: Option<&str>| {
        let mut claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
        if let Some(class) = class {
            claim["spec"]["storageClassName"] = class.into();
        }
        server.insert(&claim);
        server.edit_status::<PersistentVolumeClaim>("ns", name, |claim| {
            claim["status"] = json!({"phase": "Bound", "capacity": {"storage": "1Gi"}});
        });
    };
    claim("defaulted", None);
    claim("grows", Some("expandable"));
    let defaulted = server
        .object::<PersistentVolumeClaim>("ns", "defaulted")
        .unwrap();
    assert_eq!(
        defaulted.spec.unwrap().storage_class_name.as_deref(),
        Some("fixed"),
        "DefaultStorageClass"
    );

    let claims: Api<PersistentVolumeClaim> = Api::namespaced(server.client(), "ns");
    let grow = Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}}));
    let status = api_error(
        claims
            .patch("defaulted", &PatchParams::default(), &grow)
            .await
            .unwrap_err(),
    );
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert!(
        status.message.contains(RESIZE_FORBIDDEN),
        "{}",
        status.message
    );

    claims
        .patch("grows", &PatchParams::default(), &grow)
        .await
        .expect("expandable class");
    server.step();
    let pending = server.raw::<PersistentVolumeClaim>("ns", "grows").unwrap();
    assert_eq!(
        pending["status"]["conditions"][0]["type"],
        "FileSystemResizePending"
    );
    assert_eq!(pending["status"]["capacity"]["storage"], "1Gi");
    server.step();
    let resized = server.raw::<PersistentVolumeClaim>("ns", "grows").unwrap();
    assert_eq!(resized["status"]["capacity"]["storage"], "2Gi");
    let shrink = Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": "1Gi"}}}}));
    let status = api_error(
        claims
            .patch("grows", &PatchParams::default(), &shrink)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 422);
}
