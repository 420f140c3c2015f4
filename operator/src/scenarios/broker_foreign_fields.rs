//! Another field manager's apply of the StatefulSet merges with the operator's, as a real API
//! server merges lists by key: an env var kubectl adds to the broker container joins the
//! operator's vars instead of replacing them. The operator then names it as template drift and
//! takes it out again, as it takes back a field it applies (the container's image) from whoever
//! forced it: the Broker's spec is the one source of the pods' template.

use super::{eventually, Scenario};
use k8s_openapi::api::apps::v1::StatefulSet;
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};
use std::time::Duration;

/// `kubectl apply --server-side` of the broker container's `fields`.
fn kubectl_container(fields: Value) -> Patch<Value> {
    let mut container = json!({"name": "broker"});
    container
        .as_object_mut()
        .expect("an object")
        .extend(fields.as_object().expect("an object").clone());
    Patch::Apply(json!({
        "apiVersion": "apps/v1", "kind": "StatefulSet",
        "metadata": {"name": "qb", "namespace": "ns"},
        "spec": {"template": {"spec": {"containers": [container]}}},
    }))
}

fn broker_container(scenario: &Scenario) -> Value {
    let sts = scenario
        .server
        .raw::<StatefulSet>("ns", "qb")
        .expect("StatefulSet");
    sts["spec"]["template"]["spec"]["containers"][0].clone()
}

fn env_names(container: &Value) -> Vec<String> {
    container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|var| var["name"].as_str().map(str::to_string))
        .collect()
}

/// Wakes the operator (an annotation change) and waits for its next StatefulSet apply.
async fn operator_applies_again(scenario: &Scenario, mark: &str) {
    let applies = || {
        scenario
            .server
            .request_count("patch", "statefulsets", "qb", "")
    };
    let before = applies();
    scenario.annotate("test.quiver.io/mark", mark);
    eventually(Duration::from_secs(60), || applies() > before).await;
}

#[tokio::test(start_paused = true)]
async fn another_managers_env_var_merges_by_name_and_is_undone_with_its_image() {
    let scenario = Scenario::settled(1).await;
    let statefulsets: Api<StatefulSet> = Api::namespaced(scenario.server.client(), "ns");
    let debug = kubectl_container(json!({"env": [{"name": "DEBUG", "value": "1"}]}));
    statefulsets
        .patch("qb", &PatchParams::apply("kubectl"), &debug)
        .await
        .expect("a new env var conflicts with nobody");
    let operators = env_names(&broker_container(&scenario));
    assert!(operators.contains(&"POD_NAME".to_string()), "{operators:?}");
    assert!(operators.contains(&"DEBUG".to_string()), "{operators:?}");

    operator_applies_again(&scenario, "1").await;
    let container = broker_container(&scenario);
    let without_debug: Vec<String> = operators
        .iter()
        .filter(|name| *name != "DEBUG")
        .cloned()
        .collect();
    assert_eq!(
        env_names(&container),
        without_debug,
        "DEBUG undone, the operator's vars kept"
    );
    let drift = scenario.event("TemplateDrift", "Warning");
    let note = drift["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("by kubectl:") && note.contains("DEBUG"),
        "{note}"
    );

    // kubectl's configuration names what it manages: DEBUG too, or DEBUG would go.
    let image = kubectl_container(json!({
        "image": "quiver:debug", "env": [{"name": "DEBUG", "value": "1"}],
    }));
    let refused = statefulsets
        .patch("qb", &PatchParams::apply("kubectl"), &image)
        .await
        .expect_err("the operator owns the image");
    assert!(
        matches!(&refused, kube::Error::Api(status) if status.code == 409),
        "{refused:?}"
    );
    statefulsets
        .patch("qb", &PatchParams::apply("kubectl").force(), &image)
        .await
        .expect("forced");
    operator_applies_again(&scenario, "2").await;
    let container = broker_container(&scenario);
    assert_eq!(
        container["image"], "quiver:1",
        "the operator's field taken back"
    );
    assert_eq!(env_names(&container), without_debug, "DEBUG undone again");
    scenario.stop().await;
}
