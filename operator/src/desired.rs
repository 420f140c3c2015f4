//! Pure builders: a Broker spec (plus the reconciler's rollout plan) in, Kubernetes objects out.
//! Nothing here touches a client.

use crate::admin::BrokerPermission;
use crate::crd::{
    Broker, FlushDiskType, RetentionSpec, SecuritySpec, TlsClientAuth, TlsMode,
    VolumeRetentionPolicy, BROKER_DISK_CLEAN_PERCENT, BROKER_DISK_FORCE_CLEAN_PERCENT,
    NAMESPACE_NAME_LABEL,
};
use k8s_openapi::api::apps::v1::{
    RollingUpdateStatefulSetStrategy, StatefulSet, StatefulSetPersistentVolumeClaimRetentionPolicy,
    StatefulSetSpec, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, ConfigMap, ConfigMapVolumeSource, Container, ContainerPort, EnvVar,
    EnvVarSource, HTTPGetAction, ObjectFieldSelector, PersistentVolumeClaim,
    PersistentVolumeClaimSpec, PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, SeccompProfile, SecretKeySelector, SecretVolumeSource, SecurityContext,
    Service, ServicePort, ServiceSpec, TopologySpreadConstraint, Volume, VolumeMount,
    VolumeResourceRequirements, WeightedPodAffinityTerm,
};
use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};
use quiver_broker_config::{BrokerSettings, FlushMode};
use std::collections::{BTreeMap, BTreeSet};

mod pod;
pub use pod::{
    recreate_reason, security_hash, stateful_set, template_hash, termination_grace_seconds,
    POD_MANAGEMENT_POLICY,
};

/// Remoting port (also the name server).
pub const REMOTING_PORT: i32 = 10911;
/// HTTP port: /metrics /healthz /readyz.
pub const HTTP_PORT: i32 = 8080;
/// gRPC port of the RocketMQ 5.x clients (`apache.rocketmq.v2.MessagingService`), the port
/// Apache's Proxy listens on.
pub const GRPC_PORT: i32 = 8081;
/// Name of the store volume claim template; claims are `data-<broker>-<ordinal>`.
pub const DATA_VOLUME: &str = "data";
/// Where the store lives in the container.
pub const DATA_DIR: &str = "/data";
/// Where the ConfigMap is mounted.
pub const CONFIG_DIR: &str = "/etc/quiver";
/// The config file each pod reads: one ConfigMap key per pod, `<pod name>.json` (JSON with the
/// kebab-case keys of the broker's BrokerConfig), expanded from the POD_NAME env var.
pub const CONFIG_FILE_ARG: &str = "/etc/quiver/$(POD_NAME).json";
/// Pod template annotation holding the hash of the template and config, to detect rollouts.
pub const TEMPLATE_HASH_ANNOTATION: &str = "quiver.io/template-hash";
/// Pod template annotation holding the hash of the referenced Secrets' data: a changed
/// certificate or ACL file rolls the pods.
pub const SECURITY_HASH_ANNOTATION: &str = "quiver.io/security-hash";
/// Where the ACL Secret is mounted (the whole Secret, so kubelet updates the file in place).
pub const ACL_DIR: &str = "/etc/quiver-acl";
/// Where the TLS Secret is mounted.
pub const TLS_DIR: &str = "/etc/quiver-tls";
/// Keys of a cert-manager Certificate Secret.
pub const TLS_CERT_KEY: &str = "tls.crt";
/// The private key in a cert-manager Certificate Secret.
pub const TLS_KEY_KEY: &str = "tls.key";
/// The issuing CA in a cert-manager Certificate Secret.
pub const TLS_CA_KEY: &str = "ca.crt";
/// Keys of the admin credentials Secret.
pub const ACCESS_KEY_KEY: &str = "accessKey";
/// The secret key in the admin credentials Secret.
pub const SECRET_KEY_KEY: &str = "secretKey";
/// Seconds a stopping broker gets to close its connections (`shutdown-timeout-ms`), flush its
/// CommitLog and persist offsets; a replicated group's member gets its handover on top
/// ([`termination_grace_seconds`]).
pub const DEFAULT_TERMINATION_GRACE_SECONDS: i64 = 60;
/// Kubernetes' own `terminationGracePeriodSeconds` default: the operator never sets less.
pub const KUBERNETES_DEFAULT_GRACE_SECONDS: i64 = 30;
/// The one field manager of every server-side apply.
pub const FIELD_MANAGER: &str = "quiver-operator";
/// Label the StatefulSet controller puts on each pod with its name: selects a broker group's
/// pods (every Kubernetes version has it, unlike `apps.kubernetes.io/pod-index`).
pub const POD_NAME_LABEL: &str = "statefulset.kubernetes.io/pod-name";
/// Label on a replicated Broker's PodDisruptionBudgets naming their broker group.
pub const GROUP_LABEL: &str = "quiver.io/broker-group";

/// What the reconciler decided this pass, beyond the spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RolloutPlan {
    /// Pods to run (above spec.replicas while a scale-down drains).
    pub replicas: i32,
    /// Pods with ordinal >= partition get the new template.
    pub partition: i32,
    /// Size in the volume claim template (immutable once the StatefulSet exists).
    pub claim_size: String,
    /// Hash of the data of the Secrets `spec.security` references; None when it names none.
    pub security_hash: Option<String>,
}

impl RolloutPlan {
    /// The plan for a Broker that has no StatefulSet yet.
    pub fn initial(broker: &Broker) -> RolloutPlan {
        RolloutPlan {
            replicas: broker.spec.replicas,
            partition: 0,
            claim_size: broker.spec.storage.size.clone(),
            security_hash: None,
        }
    }
}

/// Labels on every object of a Broker, and the pod selector.
pub fn labels(broker: &Broker) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "quiver-broker".to_string(),
        ),
        ("app.kubernetes.io/instance".to_string(), broker.name_any()),
        (
            "app.kubernetes.io/component".to_string(),
            "broker".to_string(),
        ),
        (
            "app.kubernetes.io/managed-by".to_string(),
            FIELD_MANAGER.to_string(),
        ),
    ])
}

/// The label selector of a Broker's pods, as a list call takes it.
pub fn pod_selector(broker: &Broker) -> String {
    selector_labels(broker)
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

fn selector_labels(broker: &Broker) -> BTreeMap<String, String> {
    BTreeMap::from([
        (
            "app.kubernetes.io/name".to_string(),
            "quiver-broker".to_string(),
        ),
        ("app.kubernetes.io/instance".to_string(), broker.name_any()),
    ])
}

fn owner_reference(broker: &Broker) -> OwnerReference {
    broker
        .controller_owner_ref(&())
        .expect("a Broker read from the API server has a name and uid")
}

fn metadata(broker: &Broker, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: broker.namespace(),
        labels: Some(labels(broker)),
        owner_references: Some(vec![owner_reference(broker)]),
        ..ObjectMeta::default()
    }
}

/// Name of the headless Service giving each broker a stable DNS name.
pub fn headless_service_name(broker: &Broker) -> String {
    format!("{}-headless", broker.name_any())
}

/// Name of the ConfigMap holding the broker config.
pub fn config_map_name(broker: &Broker) -> String {
    format!("{}-config", broker.name_any())
}

/// Pod name of the broker with this ordinal.
pub fn pod_name(broker: &Broker, ordinal: i32) -> String {
    format!("{}-{ordinal}", broker.name_any())
}

/// The broker group of the pod with this ordinal and its replica id in the group: pods are laid
/// out group by group, group `g` holding ordinals `g*R .. g*R+R-1` (R pods per group), so adding
/// groups appends pods and the replica id of a pod never changes.
pub fn group_of(broker: &Broker, ordinal: i32) -> (i32, i32) {
    let size = broker.group_size();
    (ordinal / size, ordinal % size)
}

/// Ordinals of the pods of broker group `group`.
pub fn group_ordinals(broker: &Broker, group: i32) -> std::ops::Range<i32> {
    let size = broker.group_size();
    group * size..(group + 1) * size
}

/// Pods of `groups` broker groups.
pub fn pods_of_groups(broker: &Broker, groups: i32) -> i32 {
    groups * broker.group_size()
}

/// Broker groups among `pods` pods (a partial group counts).
pub fn groups_of_pods(broker: &Broker, pods: i32) -> i32 {
    let size = broker.group_size();
    (pods + size - 1) / size
}

/// Broker name of group `group`, shared by its pods: without replication the pod's own name
/// (as before), else `<name>-g<group>`, which no pod has.
pub fn group_name(broker: &Broker, group: i32) -> String {
    if broker.is_replicated() {
        format!("{}-g{group}", broker.name_any())
    } else {
        pod_name(broker, group)
    }
}

/// `group-members` of group `group`: `<replica id>=<address>` for every member's stable
/// remoting address, itself included (a list in the config file, as `peers`).
pub fn group_members(broker: &Broker, group: i32) -> Vec<String> {
    let size = u64::try_from(broker.group_size()).unwrap_or(1);
    member_list(broker, group, 0..size)
}

/// `<replica id>=<address>` of each of `ids`, members of group `group`.
fn member_list(broker: &Broker, group: i32, ids: impl IntoIterator<Item = u64>) -> Vec<String> {
    let first = group_ordinals(broker, group).start;
    ids.into_iter()
        .map(|id| {
            let ordinal = first + i32::try_from(id).unwrap_or(i32::MAX - first);
            format!("{id}={}", broker_address(broker, ordinal))
        })
        .collect()
}

/// Each replicated group's membership (replica ids) as its members last reported it, by group.
pub type Memberships = BTreeMap<i32, BTreeSet<u64>>;

/// The group and replica id of the pod with this ordinal. Past spec's pods, a pod that is
/// still a member of the last group (a replicas decrease keeps it until it is removed) is that
/// group's; any other is laid out as [`group_of`] says (a leaving group of a scale-down).
pub fn placement(broker: &Broker, ordinal: i32, memberships: &Memberships) -> (i32, i32) {
    let wanted = pods_of_groups(broker, broker.spec.replicas.max(1));
    let last = groups_of_pods(broker, wanted) - 1;
    let first = group_ordinals(broker, last).start;
    let kept = ordinal >= wanted
        && memberships.get(&last).is_some_and(|members| {
            u64::try_from(ordinal - first).is_ok_and(|id| members.contains(&id))
        });
    if kept {
        (last, ordinal - first)
    } else {
        group_of(broker, ordinal)
    }
}

/// Volume claim name of the broker with this ordinal.
pub fn claim_name(broker: &Broker, ordinal: i32) -> String {
    format!("{DATA_VOLUME}-{}", pod_name(broker, ordinal))
}

/// Stable remoting address of the broker with this ordinal.
pub fn broker_address(broker: &Broker, ordinal: i32) -> String {
    format!("{}.{}", pod_name(broker, ordinal), broker_scope(broker))
}

/// Stable gRPC address of the broker with this ordinal: what its routes tell 5.x clients.
pub fn grpc_address(broker: &Broker, ordinal: i32) -> String {
    format!(
        "{}.{}.{}.svc:{GRPC_PORT}",
        pod_name(broker, ordinal),
        headless_service_name(broker),
        namespace_of(broker)
    )
}

/// What every broker address of this Broker ends with: its account scope
/// ([`crate::admin::account_scope`]).
pub fn broker_scope(broker: &Broker) -> String {
    format!(
        "{}.{}.svc:{REMOTING_PORT}",
        headless_service_name(broker),
        namespace_of(broker)
    )
}

fn namespace_of(broker: &Broker) -> String {
    broker.namespace().unwrap_or_else(|| "default".to_string())
}

/// The config file of the broker with this ordinal: its own name and address, and the brokers
/// of the other groups as peers (the broker lists its own group in routes, so none of it is its
/// peer). A member of a replicated group also gets the group's members, its replica id (the
/// ordinal within the group) and the replication settings.
pub fn broker_settings(broker: &Broker, ordinal: i32, replicas: i32) -> BrokerSettings {
    member_settings(broker, ordinal, replicas, &Memberships::new())
}

/// [`broker_settings`] knowing each group's membership: a pod kept past spec's pods is placed
/// in its group ([`placement`]); a member lists the membership it holds (what it checks
/// `group-members` against at its next start), a pod not yet a member spec's members.
fn member_settings(
    broker: &Broker,
    ordinal: i32,
    replicas: i32,
    memberships: &Memberships,
) -> BrokerSettings {
    let (group, replica) = placement(broker, ordinal, memberships);
    let peers: Vec<String> = (0..replicas)
        .filter(|peer| placement(broker, *peer, memberships).0 != group)
        .map(|peer| broker_address(broker, peer))
        .collect();
    let mut settings = BrokerSettings {
        broker_name: group_name(broker, group),
        advertise: Some(broker_address(broker, ordinal)),
        data_dir: DATA_DIR.into(),
        listen: format!("0.0.0.0:{REMOTING_PORT}"),
        http_listen: format!("0.0.0.0:{HTTP_PORT}"),
        grpc_listen: format!("0.0.0.0:{GRPC_PORT}"),
        grpc_advertise: Some(grpc_address(broker, ordinal)),
        cluster: broker.name_any(),
        peers,
        flush_mode: match broker.spec.flush_disk_type {
            FlushDiskType::Async => FlushMode::Async,
            FlushDiskType::Sync => FlushMode::Sync,
        },
        ..BrokerSettings::default()
    };
    if let Some(replication) = broker.spec.replication.as_ref() {
        if broker.is_replicated() {
            let id = u64::try_from(replica).unwrap_or_default();
            settings.group_members = match memberships.get(&group) {
                Some(members) if members.contains(&id) => {
                    member_list(broker, group, members.iter().copied())
                }
                _ => group_members(broker, group),
            };
            settings.replica_id = u64::try_from(replica).ok();
            settings.replication = Some(replication.mode.broker_mode());
            settings.min_in_sync_replicas = u32::try_from(replication.min_in_sync_replicas).ok();
        }
    }
    if let Some(retention) = &broker.spec.retention {
        retention_settings(retention, &mut settings);
    }
    settings
}

/// spec.retention's settings: the hours, and the disk ratios the broker would start with.
fn retention_settings(retention: &RetentionSpec, settings: &mut BrokerSettings) {
    settings.file_reserved_hours = Some(u64::from(retention.file_reserved_hours));
    // The CEL rules allow 1..=100 but the schema type allows 0..=255; the broker takes a
    // ratio in (0, 1], so a percentage outside 1..=100 keeps the broker's default.
    let ratio = |percent: Option<u8>| {
        percent
            .filter(|p| (1..=100).contains(p))
            .map(|p| f64::from(p) / 100.0)
    };
    settings.disk_high_water_ratio = ratio(retention.disk_high_water_percent);
    let clean = ratio(retention.disk_clean_percent);
    let force_clean = ratio(retention.disk_force_clean_percent);
    // A broker whose clean ratio exceeds its force-clean ratio does not start; CEL rejects
    // such a spec (counting an absent one at the broker's default), so this is only a guard.
    let effective_clean = clean.unwrap_or(f64::from(BROKER_DISK_CLEAN_PERCENT) / 100.0);
    let effective_force_clean =
        force_clean.unwrap_or(f64::from(BROKER_DISK_FORCE_CLEAN_PERCENT) / 100.0);
    if effective_clean <= effective_force_clean {
        settings.disk_clean_ratio = clean;
        settings.disk_force_clean_ratio = force_clean;
    }
}

/// [`broker_settings`] as the JSON the config file holds.
pub fn broker_config(broker: &Broker, ordinal: i32, replicas: i32) -> serde_json::Value {
    settings_json(&broker_settings(broker, ordinal, replicas))
}

/// Settings as a JSON value: an object with its keys sorted, so the rendered file (and the
/// config hash of the pod template) does not depend on the struct's field order.
fn settings_json(settings: &BrokerSettings) -> serde_json::Value {
    serde_json::to_value(settings).expect("broker settings serialize")
}

/// ConfigMap with one config file per broker. Brokers from ordinal `draining_from` on start
/// read-only, so a leaving broker that restarts mid-drain takes no new writes.
pub fn config_map(broker: &Broker, replicas: i32, draining_from: Option<i32>) -> ConfigMap {
    config_map_of_members(broker, replicas, draining_from, &Memberships::new())
}

/// [`config_map`] knowing each replicated group's membership ([`member_settings`]).
pub fn config_map_of_members(
    broker: &Broker,
    replicas: i32,
    draining_from: Option<i32>,
    memberships: &Memberships,
) -> ConfigMap {
    let files = (0..replicas)
        .map(|ordinal| {
            let mut settings = member_settings(broker, ordinal, replicas, memberships);
            if draining_from.is_some_and(|first| ordinal >= first) {
                settings.broker_permission = Some(BrokerPermission::ReadOnly.wire_value());
            }
            let text = serde_json::to_string_pretty(&settings_json(&settings))
                .expect("json value serializes");
            (format!("{}.json", pod_name(broker, ordinal)), text)
        })
        .collect();
    ConfigMap {
        metadata: metadata(broker, config_map_name(broker)),
        data: Some(files),
        ..ConfigMap::default()
    }
}

/// Headless Service: one DNS record per broker pod, published before readiness so peers resolve.
pub fn headless_service(broker: &Broker) -> Service {
    Service {
        metadata: metadata(broker, headless_service_name(broker)),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            publish_not_ready_addresses: Some(true),
            selector: Some(selector_labels(broker)),
            ports: Some(vec![
                service_port("remoting", REMOTING_PORT),
                service_port("grpc", GRPC_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

/// Client Service: the name-server address 4.x clients bootstrap from, the endpoint 5.x clients
/// bootstrap from (gRPC), plus metrics.
pub fn client_service(broker: &Broker) -> Service {
    Service {
        metadata: metadata(broker, broker.name_any()),
        spec: Some(ServiceSpec {
            selector: Some(selector_labels(broker)),
            ports: Some(vec![
                service_port("remoting", REMOTING_PORT),
                service_port("grpc", GRPC_PORT),
                service_port("http", HTTP_PORT),
            ]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    }
}

fn service_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port,
        target_port: Some(IntOrString::String(name.to_string())),
        protocol: Some("TCP".to_string()),
        ..ServicePort::default()
    }
}

/// The PodDisruptionBudgets of `pods` pods: without replication one for the Broker (at most one
/// broker evicted at a time); with it one per broker group, each letting at most one of the
/// group's pods go at a time (a group keeps its master or a replica to fail over to, and other
/// groups may lose a pod meanwhile).
pub fn pod_disruption_budgets(broker: &Broker, pods: i32) -> Vec<PodDisruptionBudget> {
    if !broker.is_replicated() {
        return vec![pod_disruption_budget(broker)];
    }
    (0..groups_of_pods(broker, pods))
        .map(|group| group_disruption_budget(broker, group))
        .collect()
}

fn group_disruption_budget(broker: &Broker, group: i32) -> PodDisruptionBudget {
    let name = group_name(broker, group);
    let mut metadata = metadata(broker, name.clone());
    metadata
        .labels
        .get_or_insert_with(BTreeMap::new)
        .insert(GROUP_LABEL.to_string(), name);
    let pods: Vec<String> = group_ordinals(broker, group)
        .map(|ordinal| pod_name(broker, ordinal))
        .collect();
    PodDisruptionBudget {
        metadata,
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(broker)),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: POD_NAME_LABEL.to_string(),
                    operator: "In".to_string(),
                    values: Some(pods),
                }]),
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// PodDisruptionBudget: voluntary evictions take at most one broker at a time.
pub fn pod_disruption_budget(broker: &Broker) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: metadata(broker, broker.name_any()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(broker)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}

/// Where the operator runs: its namespace, and its pods' labels (empty: any pod there).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorPods {
    /// The operator's namespace.
    pub namespace: String,
    /// Labels every operator pod carries (`--operator-pod-labels`).
    pub labels: BTreeMap<String, String>,
}

impl OperatorPods {
    fn peer(&self) -> NetworkPolicyPeer {
        NetworkPolicyPeer {
            namespace_selector: Some(match_labels(BTreeMap::from([(
                NAMESPACE_NAME_LABEL.to_string(),
                self.namespace.clone(),
            )]))),
            pod_selector: (!self.labels.is_empty()).then(|| match_labels(self.labels.clone())),
            ..NetworkPolicyPeer::default()
        }
    }
}

/// `key=value[,key=value]` labels, as `--operator-pod-labels` takes them.
pub fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_string(), value.trim().to_string()))
            }
            _ => Err(format!("{pair:?} is not key=value")),
        })
        .collect()
}

/// The Broker's NetworkPolicy when `spec.networkPolicy` is set: ingress to the broker pods
/// only from clients (remoting and gRPC), the Broker's own pods and the operator's pods (remoting and
/// HTTP), and the metrics namespaces (HTTP).
pub fn network_policy(broker: &Broker, operator: &OperatorPods) -> Option<NetworkPolicy> {
    let wanted = broker.spec.network_policy.as_ref()?;
    let namespaces = |selector: &LabelSelector| NetworkPolicyPeer {
        namespace_selector: Some(selector.clone()),
        ..NetworkPolicyPeer::default()
    };
    let own_pods = NetworkPolicyPeer {
        pod_selector: Some(match_labels(selector_labels(broker))),
        ..NetworkPolicyPeer::default()
    };
    let operator = operator.peer();
    let mut clients = vec![namespaces(&wanted.client_namespace_selector)];
    if wanted.allow_same_namespace {
        clients.push(NetworkPolicyPeer {
            pod_selector: Some(LabelSelector::default()),
            ..NetworkPolicyPeer::default()
        });
    }
    let rule = |from: Vec<NetworkPolicyPeer>, ports: &[i32]| NetworkPolicyIngressRule {
        from: Some(from),
        ports: Some(ports.iter().map(|&port| tcp_port(port)).collect()),
    };
    Some(NetworkPolicy {
        metadata: metadata(broker, broker.name_any()),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(match_labels(selector_labels(broker))),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(vec![
                rule(clients, &[REMOTING_PORT, GRPC_PORT]),
                rule(vec![own_pods, operator], &[REMOTING_PORT, HTTP_PORT]),
                rule(
                    vec![namespaces(&wanted.metrics_namespace_selector)],
                    &[HTTP_PORT],
                ),
            ]),
            ..NetworkPolicySpec::default()
        }),
    })
}

fn match_labels(labels: BTreeMap<String, String>) -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels),
        ..LabelSelector::default()
    }
}

fn tcp_port(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_string()),
        ..NetworkPolicyPort::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::BrokerFixture;

    /// The file the pods read, to the byte: pretty JSON with sorted keys, as it was rendered
    /// before the settings were typed (a different text would roll every pod on upgrade).
    #[test]
    fn the_config_file_is_pretty_json_with_sorted_keys() {
        let config = config_map(&Broker::test(), 1, None);
        let text = &config.data.expect("data")["qb-0.json"];
        let expected = r#"{
  "advertise": "qb-0.qb-headless.ns.svc:10911",
  "broker-name": "qb-0",
  "cluster": "qb",
  "data-dir": "/data",
  "flush-mode": "async",
  "grpc-advertise": "qb-0.qb-headless.ns.svc:8081",
  "grpc-listen": "0.0.0.0:8081",
  "http-listen": "0.0.0.0:8080",
  "listen": "0.0.0.0:10911",
  "peers": []
}"#;
        assert_eq!(text, expected);
    }

    /// (peers as JSON, ports) of each ingress rule.
    fn ingress_rules(policy: &NetworkPolicy) -> Vec<(serde_json::Value, Vec<i32>)> {
        let spec = policy.spec.as_ref().unwrap();
        spec.ingress
            .as_ref()
            .unwrap()
            .iter()
            .map(|rule| {
                let ports = rule.ports.as_ref().unwrap().iter().map(|port| {
                    assert_eq!(port.protocol.as_deref(), Some("TCP"));
                    match port.port {
                        Some(IntOrString::Int(number)) => number,
                        ref other => panic!("named or missing port {other:?}"),
                    }
                });
                (serde_json::to_value(&rule.from).unwrap(), ports.collect())
            })
            .collect()
    }

    fn operator_in(namespace: &str) -> OperatorPods {
        OperatorPods {
            namespace: namespace.to_string(),
            labels: BTreeMap::new(),
        }
    }

    #[test]
    fn with_its_pod_labels_only_the_operators_pods_are_admitted() {
        let mut broker = Broker::test();
        broker.spec.network_policy = Some(crate::crd::BrokerNetworkPolicy::default());
        let labels =
            parse_labels("app.kubernetes.io/name=quiver-operator, app.kubernetes.io/instance=q")
                .expect("labels");
        let operator = OperatorPods {
            namespace: "quiver-system".into(),
            labels: labels.clone(),
        };
        let rules = ingress_rules(&network_policy(&broker, &operator).unwrap());
        let peer = &rules[1].0[1];
        assert_eq!(
            peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "quiver-system"
        );
        assert_eq!(
            peer["podSelector"]["matchLabels"],
            serde_json::json!(labels)
        );
        assert_eq!(rules[1].1, vec![REMOTING_PORT, HTTP_PORT]);
        assert!(parse_labels("novalue").is_err());
        assert!(parse_labels("=x").is_err());
        assert_eq!(parse_labels("").unwrap(), BTreeMap::new());
    }

    #[test]
    fn no_network_policy_unless_the_spec_asks() {
        assert!(network_policy(&Broker::test(), &operator_in("quiver-system")).is_none());
    }

    #[test]
    fn the_network_policy_opens_each_port_to_its_callers_only() {
        let mut broker = Broker::test();
        broker.spec.network_policy = Some(crate::crd::BrokerNetworkPolicy::default());
        let policy = network_policy(&broker, &operator_in("quiver-system")).expect("asked for");
        assert_eq!(policy.metadata.name.as_deref(), Some("qb"));
        assert_eq!(
            policy.metadata.owner_references.as_ref().unwrap()[0].kind,
            "Broker"
        );
        let spec = policy.spec.as_ref().unwrap();
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        let pods = serde_json::to_value(&spec.pod_selector).unwrap();
        assert_eq!(pods["matchLabels"]["app.kubernetes.io/instance"], "qb");
        let rules = ingress_rules(&policy);
        let (clients, client_ports) = &rules[0];
        assert_eq!(
            client_ports,
            &[REMOTING_PORT, GRPC_PORT],
            "4.x and 5.x clients"
        );
        assert_eq!(
            clients[0]["namespaceSelector"]["matchLabels"]["quiver.io/client"],
            "true"
        );
        assert_eq!(
            clients.as_array().unwrap().len(),
            1,
            "by default only labelled namespaces, not the Broker's own: {clients}"
        );
        let (inside, inside_ports) = &rules[1];
        assert_eq!(inside_ports, &[REMOTING_PORT, HTTP_PORT]);
        assert_eq!(inside[0]["podSelector"], pods, "the Broker's own pods");
        assert_eq!(
            inside[1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "quiver-system"
        );
        let (metrics, metrics_ports) = &rules[2];
        assert_eq!(metrics_ports, &[HTTP_PORT]);
        assert_eq!(
            metrics[0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "monitoring"
        );
    }

    #[test]
    fn with_same_namespace_its_pods_reach_the_remoting_port_too() {
        let mut broker = Broker::test();
        broker.spec.network_policy = Some(crate::crd::BrokerNetworkPolicy {
            allow_same_namespace: true,
            ..Default::default()
        });
        let rules = ingress_rules(&network_policy(&broker, &operator_in("ops")).unwrap());
        let clients = rules[0].0.as_array().unwrap();
        assert_eq!(clients.len(), 2);
        assert_eq!(clients[1], serde_json::json!({"podSelector": {}}));
    }

    #[test]
    fn minimal_spec_builds_a_complete_stateful_set() {
        let broker = Broker::test();
        let sts = stateful_set(&broker, &RolloutPlan::initial(&broker));
        let spec = &sts.spec;
        assert_eq!(spec.replicas, Some(1));
        assert_eq!(spec.service_name.as_deref(), Some("qb-headless"));
        let rolling = spec
            .update_strategy
            .as_ref()
            .unwrap()
            .rolling_update
            .as_ref()
            .unwrap();
        assert_eq!(rolling.partition, Some(0));
        let claims = spec.volume_claim_templates.as_ref().unwrap();
        assert_eq!(claims[0].metadata.name.as_deref(), Some("data"));
        let requests = claims[0]
            .spec
            .as_ref()
            .unwrap()
            .resources
            .as_ref()
            .unwrap()
            .requests
            .as_ref()
            .unwrap();
        assert_eq!(requests["storage"], Quantity("10Gi".to_string()));
        let pod = spec.template.spec.as_ref().unwrap();
        assert_eq!(
            pod.termination_grace_period_seconds,
            Some(DEFAULT_TERMINATION_GRACE_SECONDS)
        );
        let container = &pod.containers[0];
        assert_eq!(container.image.as_deref(), Some(crate::crd::DEFAULT_IMAGE));
        assert_eq!(
            container.args.as_ref().unwrap(),
            &["--config", "/etc/quiver/$(POD_NAME).json"]
        );
        let env = container.env.as_ref().unwrap();
        let pod_name = env.iter().find(|e| e.name == "POD_NAME").unwrap();
        let field = pod_name
            .value_from
            .as_ref()
            .unwrap()
            .field_ref
            .as_ref()
            .unwrap();
        assert_eq!(field.field_path, "metadata.name");
        assert!(
            pod.affinity.as_ref().unwrap().pod_anti_affinity.is_some(),
            "brokers spread across nodes by default"
        );
        assert_eq!(
            pod.topology_spread_constraints.as_ref().unwrap()[0].topology_key,
            "topology.kubernetes.io/zone"
        );
    }

    #[test]
    fn probes_use_readyz_and_healthz_on_the_http_port() {
        let broker = Broker::test();
        let sts = stateful_set(&broker, &RolloutPlan::initial(&broker));
        let container = &sts.spec.template.spec.unwrap().containers[0];
        let path = |probe: &Option<Probe>| {
            probe
                .as_ref()
                .unwrap()
                .http_get
                .as_ref()
                .unwrap()
                .path
                .clone()
                .unwrap()
        };
        assert_eq!(path(&container.readiness_probe), "/readyz");
        assert_eq!(path(&container.liveness_probe), "/healthz");
        assert_eq!(path(&container.startup_probe), "/healthz");
        let port = &container
            .readiness_probe
            .as_ref()
            .unwrap()
            .http_get
            .as_ref()
            .unwrap()
            .port;
        assert_eq!(port, &IntOrString::String("http".to_string()));
        let ports = container.ports.as_ref().unwrap();
        assert!(ports
            .iter()
            .any(|p| p.name.as_deref() == Some("http") && p.container_port == HTTP_PORT));
        assert!(ports
            .iter()
            .any(|p| p.name.as_deref() == Some("remoting") && p.container_port == REMOTING_PORT));
        assert!(ports
            .iter()
            .any(|p| p.name.as_deref() == Some("grpc") && p.container_port == GRPC_PORT));
    }

    /// The Kubernetes "restricted" Pod Security profile, and a read-only root, for plain and
    /// secure Brokers alike.
    #[test]
    fn pods_are_hardened() {
        let broker = Broker::test();
        let pod = stateful_set(&broker, &RolloutPlan::initial(&broker))
            .spec
            .template
            .spec
            .unwrap();
        let secure = secure_broker(true);
        let secure_pod = pod_spec(&secure, &RolloutPlan::initial(&secure));
        assert_eq!(secure_pod.security_context, pod.security_context);
        assert_eq!(
            secure_pod.containers[0].security_context,
            pod.containers[0].security_context
        );
        for volume in secure_pod.volumes.unwrap() {
            assert!(
                volume.secret.is_some() || volume.config_map.is_some(),
                "restricted allows {volume:?}"
            );
        }
        assert!([pod.host_network, pod.host_pid, pod.host_ipc]
            .iter()
            .all(|host| host.is_none()));
        let pod_security = pod.security_context.unwrap();
        assert_ne!(pod_security.run_as_user, Some(0));
        assert_eq!(pod_security.run_as_non_root, Some(true));
        assert_eq!(
            pod_security.seccomp_profile.unwrap().type_,
            "RuntimeDefault"
        );
        let container_security = pod.containers[0].security_context.clone().unwrap();
        assert_eq!(container_security.allow_privilege_escalation, Some(false));
        assert_eq!(container_security.read_only_root_filesystem, Some(true));
        assert_eq!(
            container_security.capabilities.unwrap().drop.unwrap(),
            vec!["ALL"]
        );
    }

    #[test]
    fn full_spec_is_carried_into_the_objects() {
        let broker = Broker::test().replicas(3).image("quiver:1.2").full_spec();
        let plan = RolloutPlan {
            replicas: 3,
            partition: 2,
            claim_size: "10Gi".to_string(),
            security_hash: None,
        };
        let sts = stateful_set(&broker, &plan);
        let spec = sts.spec;
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(
            spec.update_strategy
                .unwrap()
                .rolling_update
                .unwrap()
                .partition,
            Some(2)
        );
        let retention = spec.persistent_volume_claim_retention_policy.unwrap();
        assert_eq!(retention.when_scaled.as_deref(), Some("Delete"));
        assert_eq!(retention.when_deleted.as_deref(), Some("Delete"));
        let claim = &spec.volume_claim_templates.unwrap()[0];
        assert_eq!(
            claim.spec.as_ref().unwrap().storage_class_name.as_deref(),
            Some("fast-ssd")
        );
        let pod = spec.template.spec.unwrap();
        assert_eq!(pod.containers[0].image.as_deref(), Some("quiver:1.2"));
        assert!(pod.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .is_some());
        assert_eq!(
            pod.tolerations.unwrap()[0].key.as_deref(),
            Some("dedicated")
        );
        assert_eq!(pod.node_selector.unwrap()["disk"], "ssd");
        assert_eq!(pod.termination_grace_period_seconds, Some(120));

        let config = broker_config(&broker, 1, 3);
        assert_eq!(config["flush-mode"], "sync");
        assert_eq!(config["file-reserved-hours"], 48);
        assert_eq!(config["disk-high-water-ratio"], 0.7);
        assert_eq!(config["disk-clean-ratio"], 0.55);
        assert_eq!(config["disk-force-clean-ratio"], 0.65);
        assert_eq!(config["cluster"], "qb");
        assert_eq!(config["broker-name"], "qb-1");
        assert_eq!(config["advertise"], "qb-1.qb-headless.ns.svc:10911");
        assert_eq!(config["grpc-listen"], "0.0.0.0:8081");
        assert_eq!(config["grpc-advertise"], "qb-1.qb-headless.ns.svc:8081");
        assert_eq!(
            config["peers"],
            serde_json::json!([
                "qb-0.qb-headless.ns.svc:10911",
                "qb-2.qb-headless.ns.svc:10911"
            ]),
            "every other broker, not itself"
        );
        let files = config_map(&broker, 3, None).data.unwrap();
        let keys: Vec<&String> = files.keys().collect();
        assert_eq!(keys, ["qb-0.json", "qb-1.json", "qb-2.json"]);
    }

    #[test]
    fn the_broker_binary_accepts_the_generated_config() {
        let broker = Broker::test().replicas(3).full_spec();
        let dir = tempfile::tempdir().expect("temp dir");
        for (file, text) in config_map(&broker, 3, Some(2)).data.unwrap() {
            let path = dir.path().join(&file);
            std::fs::write(&path, text).expect("write config");
            let config = quiver_broker::BrokerConfig::from_file(&path).expect("broker parses it");
            config.validate().expect("broker accepts it");
            assert_eq!(format!("{}.json", config.broker_name), file);
            assert_eq!(config.peers.len(), 2);
            assert_eq!(config.flush_mode, quiver_broker::config::FlushMode::Sync);
            assert_eq!(config.file_reserved_hours, 48);
            assert_eq!(config.disk_high_water_ratio, 0.7);
            assert_eq!(config.store_config().disk_high_water_ratio, 0.7);
            // Read through the broker's own config keys, so this holds whatever the fields
            // are called in Rust.
            let parsed = serde_json::to_value(&config).expect("config serializes");
            assert_eq!(parsed["disk-clean-ratio"], 0.55, "{parsed}");
            assert_eq!(parsed["disk-force-clean-ratio"], 0.65, "{parsed}");
            assert_eq!(config.data_dir, std::path::PathBuf::from(DATA_DIR));
            assert_eq!(config.grpc_listen(), Some(&"0.0.0.0:8081".to_string()));
            assert_eq!(
                config.grpc_advertise,
                Some(format!("{}.qb-headless.ns.svc:8081", config.broker_name))
            );
            let read_only = config.broker_name == "qb-2";
            assert_eq!(config.broker_permission, if read_only { 4 } else { 6 });
        }
    }

    /// Holds the generated keys to the broker's own config: `group-members`, `replica-id`,
    /// `replication` and `min-in-sync-replicas` as the broker parses and validates them.
    #[test]
    fn the_broker_binary_accepts_a_replicated_groups_config() {
        let broker = Broker::test().replicas(2).replicated(3, 2).full_spec();
        let dir = tempfile::tempdir().expect("temp dir");
        for (file, text) in config_map(&broker, 6, None).data.unwrap() {
            let path = dir.path().join(&file);
            std::fs::write(&path, text).expect("write config");
            let config = quiver_broker::BrokerConfig::from_file(&path).expect("broker parses it");
            config.validate().expect("broker accepts it");
            let ordinal: i32 = file
                .trim_start_matches("qb-")
                .trim_end_matches(".json")
                .parse()
                .expect("an ordinal");
            assert_eq!(config.broker_name, format!("qb-g{}", ordinal / 3));
            assert_eq!(config.peers.len(), 3, "the other group's members");
            assert_eq!(config.members().expect("members parse").len(), 3);
            assert_eq!(config.replica_id, u64::try_from(ordinal % 3).unwrap());
        }
    }

    #[test]
    fn out_of_range_disk_high_water_percent_keeps_the_broker_default() {
        for percent in [0, 101, 255] {
            let mut broker = Broker::test().full_spec();
            if let Some(retention) = broker.spec.retention.as_mut() {
                retention.disk_high_water_percent = Some(percent);
            }
            let config = broker_config(&broker, 0, 1);
            assert!(config.get("disk-high-water-ratio").is_none(), "{percent}");
            assert_eq!(config["file-reserved-hours"], 48);
        }
        let mut broker = Broker::test().full_spec();
        if let Some(retention) = broker.spec.retention.as_mut() {
            retention.disk_high_water_percent = Some(100);
        }
        assert_eq!(broker_config(&broker, 0, 1)["disk-high-water-ratio"], 1.0);
    }

    #[test]
    fn disk_clean_percentages_become_ratios_unless_out_of_range_or_disordered() {
        let config_with = |clean: Option<u8>, force_clean: Option<u8>| {
            let mut broker = Broker::test().full_spec();
            if let Some(retention) = broker.spec.retention.as_mut() {
                retention.disk_clean_percent = clean;
                retention.disk_force_clean_percent = force_clean;
            }
            broker_config(&broker, 0, 1)
        };
        let both = config_with(Some(60), Some(80));
        assert_eq!(
            (&both["disk-clean-ratio"], &both["disk-force-clean-ratio"]),
            (&0.6.into(), &0.8.into())
        );
        let neither = config_with(None, None);
        assert!(neither.get("disk-clean-ratio").is_none());
        assert!(neither.get("disk-force-clean-ratio").is_none());
        assert_eq!(
            neither["disk-high-water-ratio"], 0.7,
            "high water is independent"
        );
        let clean_only = config_with(Some(50), None);
        assert_eq!(clean_only["disk-clean-ratio"], 0.5);
        assert!(clean_only.get("disk-force-clean-ratio").is_none());
        for out_of_range in [0, 101, 255] {
            let config = config_with(Some(out_of_range), Some(out_of_range));
            assert!(config.get("disk-clean-ratio").is_none(), "{out_of_range}");
            assert!(
                config.get("disk-force-clean-ratio").is_none(),
                "{out_of_range}"
            );
        }
        // clean above force-clean (given, or the broker's default 85) would stop the broker:
        // neither is passed on and the broker's consistent defaults apply.
        for (clean, force_clean) in [(Some(90), Some(80)), (Some(90), None), (None, Some(70))] {
            let config = config_with(clean, force_clean);
            assert!(config.get("disk-clean-ratio").is_none(), "{clean:?}");
            assert!(
                config.get("disk-force-clean-ratio").is_none(),
                "{force_clean:?}"
            );
        }
    }

    #[test]
    fn the_operator_knows_the_broker_default_disk_ratios() {
        let defaults = serde_json::to_value(quiver_broker::BrokerConfig::default())
            .expect("config serializes");
        for (key, percent) in [
            (
                "disk-high-water-ratio",
                crate::crd::BROKER_DISK_HIGH_WATER_PERCENT,
            ),
            ("disk-clean-ratio", BROKER_DISK_CLEAN_PERCENT),
            ("disk-force-clean-ratio", BROKER_DISK_FORCE_CLEAN_PERCENT),
        ] {
            assert_eq!(
                defaults[key].as_f64(),
                Some(f64::from(percent) / 100.0),
                "{key}: {defaults}"
            );
        }
    }

    #[test]
    fn every_object_is_owned_by_the_broker() {
        let broker = Broker::test();
        let plan = RolloutPlan::initial(&broker);
        let owners = [
            stateful_set(&broker, &plan).metadata.owner_references,
            headless_service(&broker).metadata.owner_references,
            client_service(&broker).metadata.owner_references,
            config_map(&broker, 1, None).metadata.owner_references,
            pod_disruption_budget(&broker).metadata.owner_references,
        ];
        for owner in owners {
            let owner = &owner.unwrap()[0];
            assert_eq!(owner.kind, "Broker");
            assert_eq!(owner.name, "qb");
            assert_eq!(owner.uid, "uid-qb");
            assert_eq!(owner.controller, Some(true));
        }
    }

    #[test]
    fn services_and_pdb() {
        let broker = Broker::test();
        let headless = headless_service(&broker).spec.unwrap();
        assert_eq!(headless.cluster_ip.as_deref(), Some("None"));
        assert_eq!(headless.publish_not_ready_addresses, Some(true));
        let named = |ports: Vec<ServicePort>| -> Vec<(String, i32, IntOrString)> {
            ports
                .into_iter()
                .map(|p| (p.name.unwrap(), p.port, p.target_port.unwrap()))
                .collect()
        };
        let by_name =
            |name: &str, port: i32| (name.to_string(), port, IntOrString::String(name.into()));
        assert_eq!(
            named(headless.ports.unwrap()),
            vec![
                by_name("remoting", REMOTING_PORT),
                by_name("grpc", GRPC_PORT)
            ],
            "each pod's gRPC address resolves through the headless Service"
        );
        let client = client_service(&broker).spec.unwrap();
        assert_eq!(
            named(client.ports.unwrap()),
            vec![
                by_name("remoting", REMOTING_PORT),
                by_name("grpc", GRPC_PORT),
                by_name("http", HTTP_PORT)
            ]
        );
        let pdb = pod_disruption_budget(&broker).spec.unwrap();
        assert_eq!(pdb.max_unavailable, Some(IntOrString::Int(1)));
        assert_eq!(
            pdb.selector.unwrap().match_labels.unwrap()["app.kubernetes.io/instance"],
            "qb"
        );
    }

    #[test]
    fn without_replication_or_with_one_replica_nothing_changes() {
        let plain = Broker::test().replicas(3).full_spec();
        let mut one = plain.clone();
        one.spec.replication = Some(crate::crd::ReplicationSpec {
            replicas: 1,
            mode: crate::crd::ReplicationMode::Sync,
            min_in_sync_replicas: 1,
        });
        let plan = RolloutPlan::initial(&plain);
        assert_eq!(stateful_set(&one, &plan), stateful_set(&plain, &plan));
        assert_eq!(config_map(&one, 3, None), config_map(&plain, 3, None));
        assert_eq!(
            pod_disruption_budgets(&one, 3),
            vec![pod_disruption_budget(&plain)]
        );
        let config = broker_config(&one, 1, 3);
        for key in [
            "group-members",
            "replica-id",
            "replication",
            "min-in-sync-replicas",
        ] {
            assert!(config.get(key).is_none(), "{key} in {config}");
        }
    }

    #[test]
    fn a_replicated_group_gets_its_members_replica_id_and_settings() {
        let broker = Broker::test().replicas(2).replicated(3, 2);
        assert_eq!(group_of(&broker, 4), (1, 1));
        assert_eq!(group_ordinals(&broker, 1), 3..6);
        assert_eq!(
            (pods_of_groups(&broker, 2), groups_of_pods(&broker, 6)),
            (6, 2)
        );
        let config = broker_config(&broker, 4, 6);
        assert_eq!(config["broker-name"], "qb-g1");
        assert_eq!(config["advertise"], "qb-4.qb-headless.ns.svc:10911");
        assert_eq!(
            config["group-members"],
            serde_json::json!([
                "0=qb-3.qb-headless.ns.svc:10911",
                "1=qb-4.qb-headless.ns.svc:10911",
                "2=qb-5.qb-headless.ns.svc:10911"
            ])
        );
        assert_eq!(config["replica-id"], 1);
        assert_eq!(config["replication"], "sync");
        assert_eq!(config["min-in-sync-replicas"], 2);
        assert_eq!(
            config["peers"],
            serde_json::json!([
                "qb-0.qb-headless.ns.svc:10911",
                "qb-1.qb-headless.ns.svc:10911",
                "qb-2.qb-headless.ns.svc:10911"
            ]),
            "the other group's members, none of its own"
        );
        let files = config_map(&broker, 6, None).data.unwrap();
        assert_eq!(files.len(), 6, "one file per pod, read through $(POD_NAME)");
        assert!(files["qb-0.json"].contains("\"replica-id\": 0"));
        assert!(files["qb-5.json"].contains("\"broker-name\": \"qb-g1\""));
    }

    #[test]
    fn a_replicated_broker_has_a_budget_per_group_and_spreads_over_zones_and_nodes() {
        let broker = Broker::test().replicas(2).replicated(3, 2);
        let budgets = pod_disruption_budgets(&broker, 6);
        let names: Vec<_> = budgets
            .iter()
            .map(|b| b.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["qb-g0", "qb-g1"]);
        let spec = budgets[1].spec.clone().unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
        let selector = spec.selector.unwrap();
        assert_eq!(
            selector.match_labels.unwrap()["app.kubernetes.io/instance"],
            "qb"
        );
        let expression = &selector.match_expressions.unwrap()[0];
        assert_eq!(
            (expression.key.as_str(), expression.operator.as_str()),
            (POD_NAME_LABEL, "In")
        );
        assert_eq!(expression.values.clone().unwrap(), ["qb-3", "qb-4", "qb-5"]);
        assert_eq!(
            budgets[1].metadata.labels.clone().unwrap()[GROUP_LABEL],
            "qb-g1"
        );
        let sts = stateful_set(&broker, &RolloutPlan::initial(&broker));
        let strategy = sts.spec.update_strategy.clone().unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("OnDelete"));
        assert!(strategy.rolling_update.is_none());
        let pod = sts.spec.template.spec.unwrap();
        let spread: Vec<_> = pod
            .topology_spread_constraints
            .unwrap()
            .into_iter()
            .map(|c| (c.topology_key, c.max_skew, c.when_unsatisfiable))
            .collect();
        assert_eq!(
            spread,
            [
                (
                    "topology.kubernetes.io/zone".to_string(),
                    1,
                    "ScheduleAnyway".to_string()
                ),
                (
                    "kubernetes.io/hostname".to_string(),
                    1,
                    "ScheduleAnyway".to_string()
                ),
            ]
        );
    }

    #[test]
    fn a_group_size_change_restarts_no_member_but_other_group_settings_do() {
        let hash = |broker: &Broker, replicas: i32| {
            let plan = RolloutPlan {
                replicas,
                ..RolloutPlan::initial(broker)
            };
            stateful_set(broker, &plan)
                .spec
                .template
                .metadata
                .unwrap()
                .annotations
                .unwrap()[TEMPLATE_HASH_ANNOTATION]
                .clone()
        };
        let two = Broker::test().replicas(1).replicated(2, 1);
        let three = Broker::test().replicas(1).replicated(3, 1);
        assert_eq!(hash(&two, 2), hash(&three, 3), "grown");
        assert_eq!(
            hash(&two, 2),
            hash(&two, 3),
            "a member kept until its removal"
        );
        assert_ne!(
            hash(&two, 2),
            hash(&three.clone().replicated(3, 2), 3),
            "min in sync"
        );
        let members = |memberships: &Memberships| {
            let files = config_map_of_members(&three, 3, None, memberships)
                .data
                .unwrap();
            let config: serde_json::Value = serde_json::from_str(&files["qb-0.json"]).unwrap();
            config["group-members"].as_array().unwrap().len()
        };
        assert_eq!(
            members(&Memberships::new()),
            3,
            "spec's members when none answered"
        );
        let before_the_add = Memberships::from([(0, BTreeSet::from([0, 1]))]);
        assert_eq!(
            members(&before_the_add),
            2,
            "the membership the member holds"
        );
    }

    #[test]
    fn a_replicated_member_gets_its_handover_on_top_of_the_stop_grace() {
        let grace = |broker: &Broker| {
            pod_spec(broker, &RolloutPlan::initial(broker)).termination_grace_period_seconds
        };
        assert_eq!(
            grace(&Broker::test()),
            Some(DEFAULT_TERMINATION_GRACE_SECONDS)
        );
        let handover =
            quiver_broker_config::defaults::SHUTDOWN_SWITCHOVER_TIMEOUT_MS.div_ceil(1000);
        let replicated = Broker::test().replicated(3, 2);
        assert_eq!(
            grace(&replicated),
            Some(DEFAULT_TERMINATION_GRACE_SECONDS + i64::try_from(handover).unwrap())
        );
        assert!(termination_grace_seconds(&replicated) >= KUBERNETES_DEFAULT_GRACE_SECONDS);
    }

    #[test]
    fn template_hash_follows_image_and_config_but_not_replicas_plan_partition() {
        let hash = |broker: &Broker, plan: &RolloutPlan| {
            stateful_set(broker, plan)
                .spec
                .template
                .metadata
                .unwrap()
                .annotations
                .unwrap()[TEMPLATE_HASH_ANNOTATION]
                .clone()
        };
        let broker = Broker::test().replicas(3);
        let plan = RolloutPlan::initial(&broker);
        let base = hash(&broker, &plan);
        assert_eq!(
            base,
            hash(
                &broker,
                &RolloutPlan {
                    partition: 2,
                    ..plan.clone()
                }
            )
        );
        assert_ne!(base, hash(&broker.clone().image("quiver:2"), &plan));
        let mut sync = broker.clone();
        sync.spec.flush_disk_type = FlushDiskType::Sync;
        assert_ne!(base, hash(&sync, &plan), "a config change rolls the pods");
    }

    /// The template hash of `broker` with `replicas` pods planned.
    fn hash_with(broker: &Broker, replicas: i32) -> String {
        let plan = RolloutPlan {
            replicas,
            ..RolloutPlan::initial(broker)
        };
        stateful_set(broker, &plan)
            .spec
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap()[TEMPLATE_HASH_ANNOTATION]
            .clone()
    }

    #[test]
    fn a_replicas_change_rolls_no_pod_but_other_settings_still_do() {
        let two = Broker::test().replicas(2);
        let base = hash_with(&two, 2);
        assert_eq!(
            base,
            hash_with(&Broker::test().replicas(3), 3),
            "scaled out"
        );
        assert_eq!(
            base,
            hash_with(&two, 3),
            "a leaving broker kept until drained"
        );
        assert_eq!(base, hash_with(&Broker::test(), 1), "a lone broker");
        let groups = |groups: i32| Broker::test().replicas(groups).replicated(2, 1);
        let replicated = hash_with(&groups(1), 2);
        assert_eq!(replicated, hash_with(&groups(2), 4), "a group added");
        assert_eq!(
            replicated,
            hash_with(&groups(1), 4),
            "a group kept until drained"
        );
        assert_ne!(base, replicated, "replication");

        let mut changed = Vec::new();
        changed.push(two.clone().image("quiver:2"));
        let mut resources = two.clone();
        resources.spec.resources = Some(k8s_openapi::api::core::v1::ResourceRequirements {
            limits: Some(BTreeMap::from([("cpu".to_string(), Quantity("2".into()))])),
            ..Default::default()
        });
        changed.push(resources);
        let mut sync = two.clone();
        sync.spec.flush_disk_type = FlushDiskType::Sync;
        changed.push(sync);
        changed.push(two.clone().full_spec());
        for broker in changed {
            assert_ne!(base, hash_with(&broker, 2), "{:?}", broker.spec);
        }
        let mut sync_replication = groups(2);
        if let Some(replication) = sync_replication.spec.replication.as_mut() {
            replication.mode = crate::crd::ReplicationMode::Async;
        }
        assert_ne!(
            replicated,
            hash_with(&sync_replication, 4),
            "replication mode"
        );
        let min_in_sync = Broker::test().replicas(2).replicated(2, 2);
        assert_ne!(replicated, hash_with(&min_in_sync, 4), "min in sync");
    }

    fn secure_broker(http: bool) -> Broker {
        let mut broker = Broker::test();
        broker.spec.security = Some(SecuritySpec {
            acl: Some(crate::crd::AclSecret {
                secret_name: "quiver-acl".into(),
                key: "acl.yml".into(),
            }),
            admin_credentials: Some(crate::crd::SecretRef {
                secret_name: "quiver-admin".into(),
            }),
            tls: Some(crate::crd::TlsSpec {
                secret_name: "quiver-tls".into(),
                mode: TlsMode::Permissive,
                client_auth: TlsClientAuth::Require,
                http,
            }),
        });
        broker
    }

    fn pod_spec(broker: &Broker, plan: &RolloutPlan) -> PodSpec {
        stateful_set(broker, plan).spec.template.spec.unwrap()
    }

    #[test]
    fn security_secrets_are_mounted_whole_and_read_only() {
        let broker = secure_broker(false);
        let pod = pod_spec(&broker, &RolloutPlan::initial(&broker));
        let secrets: Vec<(String, String)> = pod
            .volumes
            .unwrap()
            .into_iter()
            .filter_map(|volume| Some((volume.name, volume.secret?.secret_name?)))
            .collect();
        assert_eq!(
            secrets,
            vec![
                ("acl".to_string(), "quiver-acl".to_string()),
                ("tls".to_string(), "quiver-tls".to_string())
            ]
        );
        let mounts = pod.containers[0].volume_mounts.clone().unwrap();
        for (volume, dir) in [("acl", ACL_DIR), ("tls", TLS_DIR)] {
            let mount = mounts.iter().find(|m| m.name == volume).expect("mounted");
            assert_eq!(mount.mount_path, dir);
            assert_eq!(mount.read_only, Some(true));
            assert_eq!(
                mount.sub_path, None,
                "kubelet updates only whole-volume mounts"
            );
        }
    }

    #[test]
    fn security_becomes_broker_flags_and_peer_credentials() {
        let broker = secure_broker(true);
        let container = &pod_spec(&broker, &RolloutPlan::initial(&broker)).containers[0];
        assert_eq!(
            container.args.clone().unwrap(),
            [
                "--config",
                CONFIG_FILE_ARG,
                "--acl-file",
                "/etc/quiver-acl/acl.yml",
                "--tls-mode",
                "permissive",
                "--tls-cert-file",
                "/etc/quiver-tls/tls.crt",
                "--tls-key-file",
                "/etc/quiver-tls/tls.key",
                "--tls-ca-file",
                "/etc/quiver-tls/ca.crt",
                "--tls-client-auth",
                "require",
                "--http-tls",
            ]
        );
        let env = container.env.clone().unwrap();
        let secret_ref = |name: &str| {
            let var = env.iter().find(|var| var.name == name).expect(name);
            let selector = var.value_from.clone().unwrap().secret_key_ref.unwrap();
            (selector.name, selector.key)
        };
        assert_eq!(
            secret_ref("QUIVER_PEER_ACCESS_KEY"),
            ("quiver-admin".to_string(), "accessKey".to_string())
        );
        assert_eq!(
            secret_ref("QUIVER_PEER_SECRET_KEY"),
            ("quiver-admin".to_string(), "secretKey".to_string())
        );
        assert!(env
            .iter()
            .all(|var| var.value.as_deref() != Some("operator-secret")));
    }

    #[test]
    fn probes_use_https_only_when_http_serves_tls() {
        let scheme = |broker: &Broker| {
            let container = pod_spec(broker, &RolloutPlan::initial(broker)).containers[0].clone();
            [
                container.readiness_probe,
                container.liveness_probe,
                container.startup_probe,
            ]
            .map(|probe| probe.unwrap().http_get.unwrap().scheme)
        };
        assert_eq!(
            scheme(&secure_broker(true)),
            [
                Some("HTTPS".to_string()),
                Some("HTTPS".to_string()),
                Some("HTTPS".to_string())
            ]
        );
        assert_eq!(scheme(&secure_broker(false)), [None, None, None]);
        assert_eq!(scheme(&Broker::test()), [None, None, None]);
    }

    #[test]
    fn without_client_certificates_no_ca_is_asked_for() {
        let mut broker = secure_broker(false);
        let tls = broker.spec.security.as_mut().unwrap().tls.as_mut().unwrap();
        tls.client_auth = TlsClientAuth::None;
        tls.mode = TlsMode::Enforcing;
        let args = pod_spec(&broker, &RolloutPlan::initial(&broker)).containers[0]
            .args
            .clone()
            .unwrap();
        assert!(!args.contains(&"--tls-ca-file".to_string()), "{args:?}");
        assert!(args
            .windows(2)
            .any(|pair| pair == ["--tls-mode", "enforcing"]));
        assert!(args
            .windows(2)
            .any(|pair| pair == ["--tls-client-auth", "none"]));
    }

    #[test]
    fn the_security_hash_is_annotated_and_rolls_the_template() {
        let broker = secure_broker(false);
        let annotations = |plan: &RolloutPlan| {
            stateful_set(&broker, plan)
                .spec
                .template
                .metadata
                .unwrap()
                .annotations
                .unwrap()
        };
        let plan = |hash: Option<&str>| RolloutPlan {
            security_hash: hash.map(str::to_string),
            ..RolloutPlan::initial(&broker)
        };
        assert!(!annotations(&plan(None)).contains_key(SECURITY_HASH_ANNOTATION));
        let first = annotations(&plan(Some("aaaa")));
        let second = annotations(&plan(Some("bbbb")));
        assert_eq!(first[SECURITY_HASH_ANNOTATION], "aaaa");
        assert_ne!(
            first[TEMPLATE_HASH_ANNOTATION], second[TEMPLATE_HASH_ANNOTATION],
            "new Secret data is a new template: the pods roll"
        );
    }

    #[test]
    fn the_security_hash_follows_names_keys_and_values() {
        let data = |value: &str| BTreeMap::from([("k".to_string(), value.as_bytes().to_vec())]);
        let (one, two) = (data("1"), data("2"));
        let base = security_hash([("a", &one)]);
        assert_eq!(base, security_hash([("a", &one)]));
        assert_ne!(base, security_hash([("a", &two)]));
        assert_ne!(base, security_hash([("b", &one)]));
        assert_eq!(base.len(), 40, "SHA-1 in hex");
    }
}
