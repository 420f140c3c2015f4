//! spec.networkPolicy: set, the Broker owns a NetworkPolicy admitting clients, its own pods,
//! the operator's namespace and the metrics namespaces; edited, the policy follows; dropped,
//! the policy goes, while a policy of the same name that the Broker does not own stays.

use super::{eventually, Scenario};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::json;
use std::time::Duration;

fn policy(scenario: &Scenario) -> Option<NetworkPolicy> {
    scenario.server.object::<NetworkPolicy>("ns", "qb")
}

/// The namespace selector of the first peer of the first ingress rule (the clients').
fn client_selector(policy: &NetworkPolicy) -> serde_json::Value {
    let rules = policy.spec.as_ref().unwrap().ingress.as_ref().unwrap();
    let peer = &rules[0].from.as_ref().unwrap()[0];
    serde_json::to_value(&peer.namespace_selector).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_network_policy_follows_the_spec_and_goes_with_it() {
    let scenario = Scenario::settled(1).await;
    assert!(policy(&scenario).is_none(), "none unless asked for");

    // Defaults filled in by the CRD's schema, as the API server does.
    scenario.edit_broker(|broker| broker["spec"]["networkPolicy"] = json!({}));
    eventually(Duration::from_secs(120), || policy(&scenario).is_some()).await;
    let made = policy(&scenario).unwrap();
    assert_eq!(
        client_selector(&made),
        json!({"matchLabels": {"quiver.io/client": "true"}})
    );
    let rules = made.spec.as_ref().unwrap().ingress.as_ref().unwrap();
    assert_eq!(
        rules.len(),
        3,
        "clients, the Broker and the operator, metrics"
    );
    let owner = &made.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(Some(&owner.uid), scenario.broker().metadata.uid.as_ref());

    scenario.edit_broker(|broker| {
        broker["spec"]["networkPolicy"]["clientNamespaceSelector"] =
            json!({"matchLabels": {"team": "payments"}});
    });
    eventually(Duration::from_secs(120), || {
        policy(&scenario).is_some_and(|now| {
            client_selector(&now) == json!({"matchLabels": {"team": "payments"}})
        })
    })
    .await;

    scenario.edit_broker(|broker| {
        broker["spec"]
            .as_object_mut()
            .unwrap()
            .remove("networkPolicy");
    });
    eventually(Duration::from_secs(120), || policy(&scenario).is_none()).await;

    // A user's own policy named like the Broker is not the operator's to delete.
    scenario.server.insert(&json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "qb", "namespace": "ns"},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"]},
    }));
    let generation = scenario.broker().metadata.generation;
    scenario.set_image("quiver:2");
    eventually(Duration::from_secs(300), || {
        scenario.status().observed_generation > generation
    })
    .await;
    assert!(policy(&scenario).is_some(), "the user's policy stays");
    scenario.stop().await;
}
