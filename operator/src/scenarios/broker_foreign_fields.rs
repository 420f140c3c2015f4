//! The operator's forced server-side apply of the StatefulSet merges with what another field
//! manager set, as a real API server merges lists by key: an env var kubectl added to the
//! broker container survives the operator's next apply, while a field the operator applies
//! (the container's image) is taken back from whoever changed it.

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
async fn another_managers_env_var_survives_the_operators_apply_and_its_image_does_not() {
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
    assert_eq!(
        env_names(&container),
        operators,
        "DEBUG kept, the operator's vars too"
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
    assert!(env_names(&container).contains(&"DEBUG".to_string()));
    scenario.stop().await;
}
