//! spec.security: the brokers mount the ACL Secret and run with `--acl-file`; the operator signs
//! its admin calls with the account of the admin Secret (brokers with ACL on refuse the
//! unsigned ones) and, with TLS, trusts the TLS Secret's CA; a change of the ACL Secret's data
//! rolls the pods; a Secret that does not exist is a Degraded condition naming it, and the
//! StatefulSet is left alone.

use super::{addr, eventually, holds_for, Scenario};
use crate::admin::BrokerAdmin;
use crate::crd::ConsumerGroup;
use crate::desired::SECURITY_HASH_ANNOTATION;
use crate::fixtures::GroupFixture;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::ByteString;
use serde_json::json;
use std::collections::BTreeMap;
use std::time::Duration;

fn secret(name: &str, data: &[(&str, &str)]) -> Secret {
    let mut secret = Secret {
        data: Some(
            data.iter()
                .map(|(key, value)| (key.to_string(), ByteString(value.as_bytes().to_vec())))
                .collect::<BTreeMap<_, _>>(),
        ),
        ..Secret::default()
    };
    secret.metadata.name = Some(name.to_string());
    secret.metadata.namespace = Some("ns".to_string());
    secret
}

fn insert_secret(scenario: &Scenario, secret: &Secret) {
    let mut value = serde_json::to_value(secret).unwrap();
    value["apiVersion"] = json!("v1");
    value["kind"] = json!("Secret");
    scenario.server.insert(&value);
}

fn security_hash(scenario: &Scenario) -> Option<String> {
    scenario
        .statefulset()
        .spec
        .template
        .metadata
        .and_then(|metadata| metadata.annotations)
        .and_then(|annotations| annotations.get(SECURITY_HASH_ANNOTATION).cloned())
}

fn broker_args(scenario: &Scenario) -> Vec<String> {
    let pod = scenario.statefulset().spec.template.spec.unwrap();
    pod.containers[0].args.clone().unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn secrets_are_mounted_signed_with_and_rolled_on_change() {
    let scenario = Scenario::settled(1).await;
    insert_secret(
        &scenario,
        &secret("quiver-acl", &[("plain_acl.yml", "accounts: []\n")]),
    );
    insert_secret(
        &scenario,
        &secret(
            "quiver-admin",
            &[("accessKey", "operator1"), ("secretKey", "operator-secret")],
        ),
    );
    // From here on the brokers refuse calls not signed by the admin account.
    scenario.admin.require_access_key("operator1");
    scenario.edit_broker(|broker| {
        broker["spec"]["security"] = json!({
            "acl": {"secretName": "quiver-acl"},
            "adminCredentials": {"secretName": "quiver-admin"},
        });
    });
    eventually(Duration::from_secs(120), || {
        security_hash(&scenario).is_some()
    })
    .await;
    let args = broker_args(&scenario);
    assert!(
        args.windows(2)
            .any(|pair| pair == ["--acl-file", "/etc/quiver-acl/plain_acl.yml"]),
        "{args:?}"
    );
    eventually(Duration::from_secs(300), || scenario.broker_ready()).await;
    assert_eq!(
        scenario.admin.last_signer(&addr(0)).as_deref(),
        Some("operator1"),
        "the disk probe of a settled broker is signed"
    );

    let first_hash = security_hash(&scenario);
    let generation = scenario.statefulset().metadata.generation;
    scenario
        .server
        .try_edit::<Secret>("ns", "quiver-acl", |secret| {
            // "accounts: [x]\n" in Base64: the data changes, the ACL file rolls the pods.
            secret["data"]["plain_acl.yml"] = json!("YWNjb3VudHM6IFt4XQo=");
        })
        .expect("edited");
    eventually(Duration::from_secs(120), || {
        security_hash(&scenario) != first_hash
    })
    .await;
    assert!(scenario.statefulset().metadata.generation > generation);
    eventually(Duration::from_secs(300), || scenario.broker_ready()).await;

    // An operator that restarted has no account yet: a ConsumerGroup's reconcile, which may
    // run before the Broker's, takes it from the Broker's Secret itself.
    scenario.admin.use_access(
        &crate::desired::broker_scope(&scenario.broker()),
        Default::default(),
    );
    let mut group = ConsumerGroup::test();
    (group.metadata.uid, group.metadata.generation) = (None, None);
    scenario.server.insert(&group);
    eventually(Duration::from_secs(60), || {
        scenario.admin.group(&addr(0), "billing").is_some()
    })
    .await;
    assert_eq!(
        scenario.admin.last_signer(&addr(0)).as_deref(),
        Some("operator1")
    );
    scenario.stop().await;
}

#[tokio::test(start_paused = true)]
async fn a_missing_secret_is_a_condition_and_changes_nothing() {
    let scenario = Scenario::settled(1).await;
    let before = scenario.statefulset();
    scenario.edit_broker(|broker| {
        broker["spec"]["security"] = json!({"tls": {"secretName": "quiver-tls"}});
    });
    eventually(Duration::from_secs(120), || {
        scenario.condition("Degraded")
            == Some(("True".to_string(), "SecuritySecretUnavailable".to_string()))
    })
    .await;
    let message = super::condition_message(&scenario.status().conditions, "Degraded");
    assert!(message.contains("ns/quiver-tls"), "{message}");
    holds_for(Duration::from_secs(60), "the StatefulSet unchanged", || {
        scenario.statefulset().metadata.generation == before.metadata.generation
    })
    .await;

    // The Secret's creation wakes the Broker: the pods get TLS.
    insert_secret(
        &scenario,
        &secret("quiver-tls", &[("tls.crt", "CERT"), ("tls.key", "KEY")]),
    );
    eventually(Duration::from_secs(120), || {
        broker_args(&scenario).contains(&"--tls-mode".to_string())
    })
    .await;
    eventually(Duration::from_secs(300), || {
        scenario
            .condition("Degraded")
            .is_some_and(|(status, _)| status == "False")
    })
    .await;
    scenario.stop().await;
}

/// With `spec.security.tls` the operator's calls trust the TLS Secret's ca.crt and, with
/// `clientAuth: Require`, present its certificate; without TLS they are plain again.
#[tokio::test(start_paused = true)]
async fn the_operators_calls_use_the_tls_secret() {
    let scenario = Scenario::settled(1).await;
    insert_secret(
        &scenario,
        &secret(
            "quiver-tls",
            &[("tls.crt", "CERT"), ("tls.key", "KEY"), ("ca.crt", "CA")],
        ),
    );
    scenario.edit_broker(|broker| {
        broker["spec"]["security"] = json!({"tls": {
            "secretName": "quiver-tls", "mode": "Enforcing", "clientAuth": "Require",
        }});
    });
    eventually(Duration::from_secs(120), || {
        scenario.admin.tls_of(&addr(0)).is_some()
    })
    .await;
    let tls = scenario.admin.tls_of(&addr(0)).expect("TLS");
    assert_eq!(tls.ca_pem.as_deref(), Some(&b"CA"[..]));
    assert_eq!(tls.cert_pem.as_deref(), Some(&b"CERT"[..]));
    assert_eq!(tls.key_pem.as_deref(), Some(&b"KEY"[..]));
    scenario.edit_broker(|broker| {
        broker["spec"].as_object_mut().unwrap().remove("security");
    });
    eventually(Duration::from_secs(120), || {
        scenario.admin.tls_of(&addr(0)).is_none()
    })
    .await;
    scenario.stop().await;
}
