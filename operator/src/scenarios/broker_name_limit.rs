//! Broker names: admission refuses one that would make a derived object invalid, saying the
//! limit and why; one at the limit gets every object it needs, each valid as the API server
//! validates names and labels.

use super::{eventually, Scenario};
use crate::crd::{Broker, BrokerNetworkPolicy, MAX_NAME_LENGTH};
use crate::fixtures::BrokerFixture;
use crate::testapi::names;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, PostParams};
use kube::Resource;
use serde::Serialize;
use std::time::Duration;

/// Two groups of two pods and a NetworkPolicy: every kind the operator makes.
fn named(name: &str) -> Broker {
    let mut broker = Broker::test()
        .replicas(2)
        .replicated(2, 1)
        .image("quiver:1");
    broker.metadata.name = Some(name.to_string());
    broker.metadata.uid = None;
    broker.metadata.generation = None;
    broker.spec.network_policy = Some(BrokerNetworkPolicy::default());
    broker
}

/// What the API server would refuse in `objects`' names and labels.
fn problems<K: Resource<DynamicType = ()> + Serialize>(objects: &[K]) -> Vec<String> {
    let kind = K::kind(&());
    let kind = kind.as_ref();
    objects
        .iter()
        .flat_map(|object| {
            let value = serde_json::to_value(object).expect("serializes");
            let name = value["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let named = names::name_problem(kind, &name).map(|why| format!("{kind} {name}: {why}"));
            let labels = names::label_problems(&value["metadata"]["labels"])
                .into_iter()
                .map(move |(key, why)| format!("{kind} label {key}: {why}"));
            named.into_iter().chain(labels).collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_name_over_the_limit_is_refused_and_one_at_it_makes_valid_objects() {
    let scenario = Scenario::start(true).await;
    let brokers: Api<Broker> = Api::namespaced(scenario.ctx.client.clone(), "ns");
    let over = "q".repeat(MAX_NAME_LENGTH + 1);
    let refused = brokers
        .create(&PostParams::default(), &named(&over))
        .await
        .expect_err("a name over the limit is refused");
    let kube::Error::Api(status) = refused else {
        panic!("not an API refusal: {refused:?}");
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status
            .message
            .contains("metadata.name must be at most 51 characters")
            && status.message.contains("controller-revision-hash"),
        "{}",
        status.message
    );

    let at = "q".repeat(MAX_NAME_LENGTH);
    for group in 0..2 {
        let members: Vec<String> = (group * 2..group * 2 + 2)
            .map(|ordinal| format!("{at}-{ordinal}.{at}-headless.ns.svc:10911"))
            .collect();
        let group_name = format!("{at}-g{group}");
        scenario
            .admin
            .set_replication_group(&group_name, &members, 1);
    }
    brokers
        .create(&PostParams::default(), &named(&at))
        .await
        .expect("a name at the limit is admitted");
    eventually(Duration::from_secs(900), || {
        let pods = scenario.server.list::<Pod>("ns");
        let ready = scenario
            .server
            .object::<Broker>("ns", &at)
            .and_then(|broker| broker.status)
            .is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            });
        pods.len() == 4 && ready
    })
    .await;

    let server = &scenario.server;
    let statefulsets = server.list::<StatefulSet>("ns");
    let services = server.list::<Service>("ns");
    let budgets = server.list::<PodDisruptionBudget>("ns");
    let pods = server.list::<Pod>("ns");
    let claims = server.list::<PersistentVolumeClaim>("ns");
    let counts = [
        statefulsets.len(),
        services.len(),
        server.list::<ConfigMap>("ns").len(),
        budgets.len(),
        server.list::<NetworkPolicy>("ns").len(),
        pods.len(),
        claims.len(),
    ];
    assert_eq!(counts, [1, 2, 1, 2, 1, 4, 4], "every object made");
    let mut invalid = problems(&statefulsets);
    invalid.extend(problems(&services));
    invalid.extend(problems(&server.list::<ConfigMap>("ns")));
    invalid.extend(problems(&budgets));
    invalid.extend(problems(&server.list::<NetworkPolicy>("ns")));
    invalid.extend(problems(&pods));
    invalid.extend(problems(&claims));
    assert_eq!(invalid, Vec::<String>::new());
    for pod in &pods {
        let name = pod.metadata.name.clone().unwrap_or_default();
        assert!(names::is_dns1123_label(&name), "pod {name} is its hostname");
    }
    // A real server's revision hash has up to 10 characters (this one's 8): still a label value.
    let statefulset = statefulsets[0].metadata.name.clone().unwrap_or_default();
    let longest_revision = format!("{statefulset}-{}", "x".repeat(10));
    assert!(
        names::is_label_value(&longest_revision),
        "{longest_revision}"
    );
    scenario.stop().await;
}
