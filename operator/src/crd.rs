//! The custom resources: `Broker` and `ConsumerGroup` (quiver.io/v1alpha1).
//!
//! The CRD YAML in `crds/` is generated from these types by the `crdgen` binary; CEL rules
//! declared here are enforced by the API server and unit-tested locally.

use k8s_openapi::api::core::v1::{
    Affinity, ResourceRequirements, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// API group of both resources.
pub const GROUP: &str = "quiver.io";
/// Annotation that stops reconciliation of a Broker while set to "true".
pub const PAUSE_ANNOTATION: &str = "quiver.io/paused";
/// Annotation that, while set to "true", lets a scale-down proceed without waiting for the drain:
/// what the leaving brokers still hold is dropped with them.
pub const FORCE_SCALE_DOWN_ANNOTATION: &str = "quiver.io/force-scale-down";
/// Annotation asking for a restart of every broker pod, one at a time like a rollout: its value
/// is a token (a timestamp, say), and a new value asks for a new restart.
pub const RESTART_ANNOTATION: &str = "quiver.io/restart";
/// Default broker image, used when `spec.image` is empty: the broker of the operator's own
/// release, so an upgrade of the operator is what moves the brokers.
pub const DEFAULT_IMAGE: &str = concat!(
    "ghcr.io/quiver-mq/quiver-broker:",
    env!("CARGO_PKG_VERSION")
);
/// Default `spec.progressDeadlineSeconds`, as Deployments have.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i64 = 600;
/// The broker's default `disk-high-water-ratio`, as a percentage.
pub const BROKER_DISK_HIGH_WATER_PERCENT: u8 = 90;
/// The broker's default `disk-clean-ratio`, as a percentage (also in the CEL rule below).
pub const BROKER_DISK_CLEAN_PERCENT: u8 = 75;
/// The broker's default `disk-force-clean-ratio`, as a percentage (also in the CEL rule below).
pub const BROKER_DISK_FORCE_CLEAN_PERCENT: u8 = 85;

/// The longest Broker name: every object named after it stays valid ([`name_length_rule`]).
pub const MAX_NAME_LENGTH: usize = 51;

/// CEL on the root, where a real API server shows `metadata.name`: the name fits
/// [`MAX_NAME_LENGTH`]. The limits that bind are label values (63 characters): the StatefulSet
/// named after the Broker labels its pods `controller-revision-hash: <name>-<hash>` with a hash
/// of up to 10 characters (kubernetes/kubernetes#64023), and a replicated Broker's budgets carry
/// `quiver.io/broker-group: <name>-g<group>` with a group index of up to 10 digits.
fn name_length_rule() -> kube::core::Rule {
    let message = format!(
        "metadata.name must be at most {MAX_NAME_LENGTH} characters: the Broker's pods carry the \
         label controller-revision-hash=<name>-<revision hash of up to 10 characters> and a \
         replicated Broker's disruption budgets quiver.io/broker-group=<name>-g<group index of \
         up to 10 digits>, and label values are limited to 63 characters"
    );
    kube::core::Rule::new(format!("size(self.metadata.name) <= {MAX_NAME_LENGTH}"))
        .message(message.as_str())
}

/// CEL on the root: the name is a DNS-1035 label, since the client Service is named after it
/// (a custom resource's name may otherwise hold dots or start with a digit).
fn name_form_rule() -> kube::core::Rule {
    kube::core::Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message(
        "metadata.name must be a DNS-1035 label (lowercase letters, digits and '-', starting \
         with a letter and ending with a letter or digit): the Broker's Services are named after \
         it",
    )
}

/// A cluster of Quiver brokers: one StatefulSet pod per broker, each with its own store volume.
// Several printcolumn(type_ = ..) entries are distinct columns, not duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "quiver.io",
    version = "v1alpha1",
    kind = "Broker",
    namespaced,
    status = "BrokerStatus",
    shortname = "qb",
    doc = "A cluster of Quiver (RocketMQ-compatible) brokers",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(name = "Replicas", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(
        name = "Disk Pressure",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"DiskPressure\")].status"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    ),
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.labelSelector"
    ),
    validation = name_length_rule(),
    validation = name_form_rule()
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.replication) ? self.replication.replicas : 1) == (has(oldSelf.replication) ? oldSelf.replication.replicas : 1) || ((has(self.replication) ? self.replication.replicas : 1) >= 2 && (has(oldSelf.replication) ? oldSelf.replication.replicas : 1) >= 2 && self.replicas == 1 && oldSelf.replicas == 1)").message("replication.replicas may change only between 2 or more, with one broker group (replicas 1) before and after: a group's pods are ordinals g*R..g*R+R-1, so a group size change with several groups would move pods between groups, and one of 1 is a broker without replication (another broker name)"))]
pub struct BrokerSpec {
    /// Number of brokers (broker groups, with `replication`); scale-down drains the leaving
    /// brokers first.
    #[x_kube(validation = Rule::new("self >= 1").message("replicas must be at least 1"))]
    pub replicas: i32,
    /// Broker container image.
    #[serde(default)]
    pub image: String,
    /// Store volume of each broker.
    pub storage: StorageSpec,
    /// Compute resources of the broker container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// ASYNC (default) acknowledges before fsync; SYNC acknowledges after group commit.
    #[serde(default)]
    pub flush_disk_type: FlushDiskType,
    /// Topics created on every broker.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub topics: Vec<TopicSpec>,
    /// CommitLog retention, and the disk usage at which the brokers delete early and refuse sends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention: Option<RetentionSpec>,
    /// Scheduling overrides for the broker pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_template: Option<PodOverrides>,
    /// Seconds a rollout or start may go without progress (a pod updated or becoming Ready)
    /// before the Broker is Degraded with reason ProgressDeadlineExceeded; default 600.
    #[serde(default = "default_progress_deadline_seconds")]
    #[x_kube(validation = Rule::new("self >= 1").message("progressDeadlineSeconds must be at least 1"))]
    pub progress_deadline_seconds: i64,
    /// When set, a NetworkPolicy owned by the Broker admits only the listed traffic to the
    /// broker pods; when absent, no policy is made (and one made before is deleted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<BrokerNetworkPolicy>,
    /// ACL and TLS of the brokers, from Secrets in the Broker's namespace; a change of a
    /// referenced Secret's content rolls the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub security: Option<SecuritySpec>,
    /// Replicated broker groups: each broker is a group of `replicas` pods sharing its broker
    /// name, one master and its replicas, with automatic failover. Absent: one pod per broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<ReplicationSpec>,
    /// What a scale-down waits for before the leaving brokers go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
}

/// What a scale-down's drain waits for.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainSpec {
    /// Also wait until the dead-letter topics (`%DLQ%<group>`) on the leaving brokers are read
    /// to the end; default false: their messages are reported in status.drain.deadLetters and
    /// dropped with the brokers (nobody may ever read them, so waiting could last forever).
    #[serde(default)]
    pub wait_for_dead_letters: bool,
}

/// How each broker is replicated within its group.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.minInSyncReplicas <= self.replicas").message("replication.minInSyncReplicas must not exceed replication.replicas"))]
pub struct ReplicationSpec {
    /// Pods per broker group, the master included; default 1 (no replication). May change
    /// between 2 or more while there is one group: the operator adds or removes members
    /// through the group's consensus, restarting no member.
    #[serde(default = "default_one")]
    #[x_kube(validation = Rule::new("self >= 1").message("replication.replicas must be at least 1"))]
    pub replicas: i32,
    /// Async (default): a send is acknowledged by the master alone; Sync: once
    /// minInSyncReplicas members (the master included) hold it.
    #[serde(default)]
    pub mode: ReplicationMode,
    /// Members (the master included) that must be in sync for the master to take sends;
    /// default 1.
    #[serde(default = "default_one")]
    #[x_kube(validation = Rule::new("self >= 1").message("replication.minInSyncReplicas must be at least 1"))]
    pub min_in_sync_replicas: i32,
}

fn default_one() -> i32 {
    1
}

impl Default for ReplicationSpec {
    fn default() -> Self {
        ReplicationSpec {
            replicas: 1,
            mode: ReplicationMode::Async,
            min_in_sync_replicas: 1,
        }
    }
}

/// When a replicated group acknowledges a send.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum ReplicationMode {
    /// Once the master stored it; replicas follow.
    #[default]
    Async,
    /// Once minInSyncReplicas members hold it.
    Sync,
}

impl ReplicationMode {
    /// The broker's `replication` setting.
    pub fn broker_mode(self) -> quiver_broker_config::ReplicationMode {
        match self {
            ReplicationMode::Async => quiver_broker_config::ReplicationMode::Async,
            ReplicationMode::Sync => quiver_broker_config::ReplicationMode::Sync,
        }
    }

    /// The broker's `--replication` value.
    pub fn flag(self) -> &'static str {
        self.broker_mode().as_str()
    }
}

/// ACL and TLS of the brokers. With `acl` set the brokers refuse unsigned requests, so the
/// operator's own admin calls need `adminCredentials` (an admin account of the ACL file).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.acl) || has(self.adminCredentials)").message("security.acl needs security.adminCredentials: the operator signs its admin calls with that account"))]
pub struct SecuritySpec {
    /// The Secret holding Apache's `plain_acl.yml`; the brokers run with `--acl-file`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<AclSecret>,
    /// The Secret holding the admin account (keys `accessKey`, `secretKey`) the operator signs
    /// its admin calls with, and the brokers sign their peer polls with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_credentials: Option<SecretRef>,
    /// TLS on the remoting port (and optionally HTTP), from a Secret in cert-manager's
    /// Certificate format (`tls.crt`, `tls.key`, `ca.crt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,
}

/// A Secret in the Broker's namespace.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
}

/// The Secret holding the ACL file.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct AclSecret {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// The key holding the file; default `plain_acl.yml`.
    #[serde(default = "default_acl_key")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$')").message("key must be a Secret key: letters, digits, '-', '_' and '.'"))]
    pub key: String,
}

/// The key of the ACL Secret the brokers read by default.
pub const DEFAULT_ACL_KEY: &str = "plain_acl.yml";

fn default_acl_key() -> String {
    DEFAULT_ACL_KEY.to_string()
}

/// TLS of the brokers (Apache's permissive and enforcing modes).
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// The Secret with `tls.crt`, `tls.key` and, for client certificates, `ca.crt` (what a
    /// cert-manager Certificate writes).
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Permissive: TLS and plain clients on the same port; Enforcing (default): TLS only.
    #[serde(default)]
    pub mode: TlsMode,
    /// Whether clients must present a certificate signed by `ca.crt`; default None.
    #[serde(default)]
    pub client_auth: TlsClientAuth,
    /// Serve the HTTP port (/metrics, /healthz, /readyz) over TLS too; the probes then use
    /// HTTPS. Default false.
    #[serde(default)]
    pub http: bool,
}

/// How the remoting port takes TLS.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum TlsMode {
    /// TLS and plain connections on the same port.
    Permissive,
    /// TLS connections only.
    #[default]
    Enforcing,
}

/// Whether the brokers ask clients for a certificate.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum TlsClientAuth {
    /// No client certificate asked for.
    #[default]
    None,
    /// A client certificate, when given, must be signed by `ca.crt`.
    Optional,
    /// Every client must present a certificate signed by `ca.crt`.
    Require,
}

/// Who may reach the broker pods. Always admitted: the Broker's own pods (peer routing) and the
/// operator's namespace (admin calls, health); each rule names the ports it opens.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokerNetworkPolicy {
    /// Namespaces whose pods may produce and consume (the remoting port). Default: namespaces
    /// labelled `quiver.io/client: "true"`.
    #[serde(default = "default_client_namespaces")]
    pub client_namespace_selector: LabelSelector,
    /// Also admit every pod of the Broker's own namespace to the remoting port; default false
    /// (label the namespace `quiver.io/client: "true"`, or set this, to let its pods in).
    #[serde(default)]
    pub allow_same_namespace: bool,
    /// Namespaces whose pods may scrape `/metrics` (the HTTP port). Default: the namespace
    /// named `monitoring`.
    #[serde(default = "default_metrics_namespaces")]
    pub metrics_namespace_selector: LabelSelector,
}

/// The label that marks a namespace whose pods are clients of the brokers.
pub const CLIENT_NAMESPACE_LABEL: &str = "quiver.io/client";
/// The label every namespace carries with its own name (Kubernetes 1.22 and later).
pub const NAMESPACE_NAME_LABEL: &str = "kubernetes.io/metadata.name";

fn match_label(key: &str, value: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(BTreeMap::from([(key.to_owned(), value.to_owned())])),
        ..LabelSelector::default()
    }
}

fn default_client_namespaces() -> LabelSelector {
    match_label(CLIENT_NAMESPACE_LABEL, "true")
}

fn default_metrics_namespaces() -> LabelSelector {
    match_label(NAMESPACE_NAME_LABEL, "monitoring")
}

impl Default for BrokerNetworkPolicy {
    fn default() -> Self {
        BrokerNetworkPolicy {
            client_namespace_selector: default_client_namespaces(),
            allow_same_namespace: false,
            metrics_namespace_selector: default_metrics_namespaces(),
        }
    }
}

fn default_progress_deadline_seconds() -> i64 {
    DEFAULT_PROGRESS_DEADLINE_SECONDS
}

/// Store volume: size may only grow, the storage class is fixed at creation.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.storageClassName) == has(oldSelf.storageClassName) && (!has(self.storageClassName) || self.storageClassName == oldSelf.storageClassName)").message("storageClassName is immutable"))]
pub struct StorageSpec {
    /// Volume size as a Kubernetes quantity, e.g. "10Gi"; may only grow.
    #[schemars(length(max = 64))]
    #[x_kube(validation = Rule::new("isQuantity(self)").message("size must be a quantity such as 10Gi"))]
    #[x_kube(validation = Rule::new("!isQuantity(oldSelf) || !isQuantity(self) || quantity(self).compareTo(quantity(oldSelf)) >= 0").message("storage size may only grow"))]
    pub size: String,
    /// Storage class of the volume claims; the cluster default when absent.
    #[schemars(length(max = 253))]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// What happens to a broker's volume claim when it is scaled away or the Broker is deleted.
    #[serde(default)]
    pub retention_policy: VolumeRetentionPolicy,
}

/// Fate of a removed broker's PersistentVolumeClaim.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
pub enum VolumeRetentionPolicy {
    /// Keep the claim (and its data) for a later scale-up or manual recovery.
    #[default]
    Retain,
    /// Delete the claim with the broker.
    Delete,
}

/// Durability of acknowledged sends.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "UPPERCASE")]
pub enum FlushDiskType {
    /// Flush on a timer; a send is acknowledged once it is in the page cache.
    #[default]
    Async,
    /// Group-commit fsync before the send is acknowledged.
    Sync,
}

/// A topic the broker creates at start.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicSpec {
    /// Topic name: letters, digits, '%', '-', '_' and '|', at most 127 characters.
    #[schemars(length(max = 127))]
    #[x_kube(validation = Rule::new("self.matches('^[%|a-zA-Z0-9_-]{1,127}$')").message("topic names use letters, digits, %, |, - and _ (1-127 characters)"))]
    pub name: String,
    /// Read and write queues of the topic on each broker.
    #[serde(default = "default_queues")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 1024").message("queues must be between 1 and 1024"))]
    pub queues: i32,
}

fn default_queues() -> i32 {
    8
}

/// CommitLog retention and the broker's disk thresholds. The thresholds are percentages of the
/// store's file system in use; from lowest to highest: clean, force-clean, high water.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("(has(self.diskCleanPercent) ? self.diskCleanPercent : 75) <= (has(self.diskForceCleanPercent) ? self.diskForceCleanPercent : 85)").message("diskCleanPercent (broker default 75) must not exceed diskForceCleanPercent (broker default 85)"))]
pub struct RetentionSpec {
    /// Hours a CommitLog segment is kept after its last write (RocketMQ fileReservedTime).
    pub file_reserved_hours: u32,
    /// Disk usage percentage above which the broker refuses sends (RocketMQ code 14,
    /// SERVICE_NOT_AVAILABLE) while it keeps serving reads, and starts read-only
    /// (1-100; broker default 90).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("diskHighWaterPercent must be between 1 and 100"))]
    pub disk_high_water_percent: Option<u8>,
    /// Disk usage percentage above which retention deletes unexpired CommitLog segments early,
    /// oldest first, but only those every consumer group with committed offsets has read
    /// (1-100, at most diskForceCleanPercent; broker default 75).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("diskCleanPercent must be between 1 and 100"))]
    pub disk_clean_percent: Option<u8>,
    /// Disk usage percentage above which retention deletes the oldest CommitLog segment even if
    /// it holds messages a consumer group has not consumed yet (1-100; broker default 85).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 100").message("diskForceCleanPercent must be between 1 and 100"))]
    pub disk_force_clean_percent: Option<u8>,
}

/// Scheduling overrides for the broker pods; defaults spread brokers across nodes.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodOverrides {
    /// Replaces the default preferred anti-affinity between brokers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations of the broker pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// Replaces the default zone spread.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// Node selector of the broker pods.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Seconds a stopping broker gets to flush and close; default 60.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination_grace_period_seconds: Option<i64>,
}

/// Observed state of a Broker.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokerStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Brokers whose pod is Ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Brokers currently running (may exceed spec.replicas while a scale-down drains).
    #[serde(default)]
    pub current_replicas: i32,
    /// Broker groups (spec.replicas' unit) the StatefulSet runs: spec.replicas, more while a
    /// scale-down drains. The scale subresource's status.replicas (kubectl scale, HPA, KEDA).
    #[serde(default)]
    pub replicas: i32,
    /// The label selector of the Broker's pods, as a string: the scale subresource's selector,
    /// the pods an HPA averages their metrics over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// Remoting address of each broker, by ordinal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub brokers: Vec<BrokerAddress>,
    /// Ready, Progressing, Degraded, Paused, DiskPressure (a broker's disk is above its high
    /// water or it refuses writes; Unknown when no broker reported) and VolumeExpansion (while
    /// spec.storage.size exceeds the claims' original size).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Brokers the operator made read-only: the ones draining, and kept ones a cancelled
    /// scale-down left read-only that could not be made writable yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_only_brokers: Vec<String>,
    /// When the brokers last moved towards the spec (new generation, a pod updated or Ready, a
    /// partition step), RFC 3339; spec.progressDeadlineSeconds counts from here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_progress_time: Option<String>,
    /// Scale-down in progress: the brokers being drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainStatus>,
    /// Rolling update in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutStatus>,
    /// Volume expansion in progress or done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<StorageStatus>,
    /// Replicated broker groups as their members report them (with spec.replication only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replication: Option<BrokerReplicationStatus>,
    /// The last restart asked for with the `quiver.io/restart` annotation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart: Option<RestartStatus>,
}

/// A restart asked for with the `quiver.io/restart` annotation.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestartStatus {
    /// The annotation's value the restart is for.
    pub token: String,
    /// InProgress while pods restart one at a time, then Completed.
    pub state: RestartState,
}

/// Where a requested restart stands.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum RestartState {
    /// Pods are being restarted one at a time.
    InProgress,
    /// Every pod restarted and is Ready.
    Completed,
}

/// The broker groups of a replicated Broker.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokerReplicationStatus {
    /// One entry per broker group, by group index.
    #[serde(default)]
    pub groups: Vec<ReplicationGroupStatus>,
}

/// One broker group: its master, epoch and in-sync set, as the member answering with the newest
/// epoch reports them (its master, when it answered).
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicationGroupStatus {
    /// The group's broker name.
    pub name: String,
    /// The group's epoch (bumped at each change of master); absent when no member answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The master's pod; absent when the group has no master or no member answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
    /// Pods of the in-sync set, the master included.
    #[serde(default)]
    pub in_sync: Vec<String>,
    /// Every member of the group.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub members: Vec<ReplicaMemberStatus>,
}

/// One member of a broker group.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReplicaMemberStatus {
    /// Its replica id (its index in the group).
    pub replica_id: u64,
    /// Its pod.
    pub pod: String,
    /// Master, Replica, Unknown (not told its role yet), or Unreachable (no member reported it
    /// and it did not answer).
    pub role: String,
    /// Whether it is in the in-sync set.
    pub in_sync: bool,
    /// Bytes behind the master's CommitLog end, as the master last saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_bytes: Option<u64>,
}

/// One broker's name and address.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BrokerAddress {
    /// Broker name (the pod name).
    pub name: String,
    /// Remoting address `host:port` by stable DNS name.
    pub address: String,
}

/// Progress of a safe scale-down.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainStatus {
    /// Brokers made read-only and waiting for consumers to catch up.
    pub brokers: Vec<String>,
    /// Messages still unconsumed on those brokers, summed over groups with a commit.
    pub remaining_messages: u64,
    /// Groups still behind on the draining brokers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_groups: Vec<String>,
    /// Messages on the draining brokers in queues no group has committed on.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub messages_without_group: u64,
    /// Topics holding those messages, and SCHEDULE_TOPIC_XXXX while delayed messages are not
    /// yet due.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending_topics: Vec<String>,
    /// Draining brokers that did not answer: their backlog is unknown.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unreachable_brokers: Vec<String>,
    /// What the drain waits for, per topic and group, most unread first: a group's unread
    /// messages where it committed; without a group, messages no group committed on (and the
    /// delayed messages of SCHEDULE_TOPIC_XXXX not yet due). At most 20 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_for: Vec<DrainWait>,
    /// Entries left out of waitingFor to keep the status small.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub waiting_for_not_listed: u32,
    /// Unread messages in dead-letter topics (`%DLQ%<group>`) on the draining brokers.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dead_letter_messages: u64,
    /// Dead-letter topics (`%DLQ%<group>`) holding unread messages on the draining brokers,
    /// most first: reported, not waited for (unless spec.drain.waitForDeadLetters), so they
    /// are dropped with the brokers. At most 20 entries.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dead_letters: Vec<DeadLetterTopic>,
    /// Entries left out of deadLetters to keep the status small.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub dead_letters_not_listed: u32,
}

/// Unread messages a drain waits for in one topic, for one group or none.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DrainWait {
    /// Topic.
    pub topic: String,
    /// The group that has not read them where it committed; absent for messages no group
    /// committed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Unread messages, over the draining brokers.
    pub unread: u64,
}

/// A dead-letter topic's unread messages on the draining brokers.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadLetterTopic {
    /// The dead-letter topic, `%DLQ%<group>`.
    pub topic: String,
    /// Its messages no group has read, over the draining brokers.
    pub messages: u64,
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// Progress of a one-pod-at-a-time rollout.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// Pods with an ordinal at or above this run the new template.
    pub partition: i32,
    /// Pods already updated.
    pub updated_replicas: i32,
}

/// Volume expansion progress.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StorageStatus {
    /// Requested size of every claim.
    pub requested: String,
    /// Claims whose capacity reached the requested size.
    pub resized_claims: i32,
    /// Claims of the current brokers.
    pub total_claims: i32,
}

/// A consumer group on the brokers of one Broker resource, with its lag in status.
// Several printcolumn(type_ = ..) entries are distinct columns, not duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "quiver.io",
    version = "v1alpha1",
    kind = "ConsumerGroup",
    namespaced,
    status = "ConsumerGroupStatus",
    shortname = "qcg",
    doc = "A RocketMQ consumer group managed on a Quiver Broker, with its lag",
    printcolumn(name = "Broker", type_ = "string", json_path = ".spec.brokerRef"),
    printcolumn(name = "Members", type_ = "integer", json_path = ".status.members"),
    printcolumn(name = "Lag", type_ = "integer", json_path = ".status.totalLag"),
    printcolumn(
        name = "Lag Seconds",
        type_ = "number",
        json_path = ".status.lagSeconds"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerGroupSpec {
    /// Name of the Broker (same namespace) the group lives on.
    #[schemars(length(max = 253))]
    #[x_kube(validation = Rule::new("self == oldSelf").message("brokerRef is immutable"))]
    pub broker_ref: String,
    /// Topics the group consumes; lag is reported for these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024), inner(length(max = 127)))]
    #[x_kube(validation = Rule::new("self.all(t, t.matches('^[%|a-zA-Z0-9_-]{1,127}$'))").message("topic names use letters, digits, %, |, - and _ (1-127 characters)"))]
    pub topics: Vec<String>,
    /// Where a new member starts when the group has no committed offset.
    #[serde(default)]
    pub consume_from_where: ConsumeFromWhere,
    /// Retries before a message goes to the dead-letter queue.
    #[serde(default = "default_max_reconsume_times")]
    #[x_kube(validation = Rule::new("self >= 0 && self <= 64").message("maxReconsumeTimes must be between 0 and 64"))]
    pub max_reconsume_times: i32,
    /// Whether the brokers serve pulls for this group.
    #[serde(default = "default_true")]
    pub consume_enable: bool,
    /// Thresholds of the Lagging condition.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_thresholds: Option<LagThresholds>,
    /// A one-time offset reset, applied once per `id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_reset: Option<OffsetResetSpec>,
    /// Delete the group and its committed offsets from the brokers when this resource is deleted.
    #[serde(default)]
    pub delete_offsets_on_delete: bool,
}

fn default_max_reconsume_times() -> i32 {
    16
}

fn default_true() -> bool {
    true
}

/// RocketMQ ConsumeFromWhere.
#[derive(
    Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, schemars::JsonSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ConsumeFromWhere {
    /// Start at the queue's max offset.
    #[default]
    ConsumeFromLastOffset,
    /// Start at offset 0.
    ConsumeFromFirstOffset,
    /// Start at the first message stored after a timestamp.
    ConsumeFromTimestamp,
}

/// Thresholds of the Lagging condition (either one exceeded sets it) and the window the
/// Consuming and Stalled conditions are judged over.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, Eq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.stalledPolls) || !has(self.windowSeconds)").message("stalledPolls is deprecated: set windowSeconds alone"))]
pub struct LagThresholds {
    /// Total unconsumed messages above which the group is Lagging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<u64>,
    /// Seconds behind above which the group is Lagging.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seconds: Option<u64>,
    /// Wall-clock window the group's progress is judged over: Stalled after lag > 0 and no
    /// commit for this long, FallingBehind after lag did not go down for this long; default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 604800").message("windowSeconds must be between 1 and 604800 (7 days)"))]
    pub window_seconds: Option<u64>,
    /// Deprecated: use windowSeconds. Read as a window of this many lag polls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_polls: Option<u32>,
}

/// An offset reset request, applied once per `id`.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.to != 'Timestamp' || has(self.timestampMillis)").message("timestampMillis is required when to is Timestamp"))]
pub struct OffsetResetSpec {
    /// Any string; change it to request another reset.
    pub id: String,
    /// Target of the reset.
    pub to: OffsetResetTarget,
    /// Milliseconds since the epoch, for `to: Timestamp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timestamp_millis: Option<i64>,
}

/// Where an offset reset moves the committed offsets.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum OffsetResetTarget {
    /// The queue's min offset.
    Earliest,
    /// The queue's max offset (skip everything stored).
    Latest,
    /// The first message stored at or after `timestampMillis`.
    Timestamp,
}

/// Observed state of a ConsumerGroup.
#[derive(Deserialize, Serialize, Clone, Debug, Default, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerGroupStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Unconsumed messages over queues with a commit; absent when nothing was committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total_lag: Option<u64>,
    /// Seconds since the oldest unconsumed message was stored; 0 when caught up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_seconds: Option<f64>,
    /// Lag per topic.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub topics: Vec<TopicLagStatus>,
    /// The queues with the most lag (at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top_queues: Vec<QueueLagStatus>,
    /// Queues with lag and no commit for the whole judgement window, even while the group's
    /// sums move (longest stalled first, then most lag; at most 10, see stalledQueueCount).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stalled_queues: Vec<StalledQueueStatus>,
    /// How many queues are stalled in all; absent when the progress is not judged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_queue_count: Option<u32>,
    /// Ready, Lagging, Consuming, Stalled and QueuesStalled.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The last offset reset applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_offset_reset: Option<AppliedOffsetReset>,
    /// An offset reset being applied: recorded before each broker's reset call, so a reset is
    /// never applied twice on a broker.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset_reset_in_progress: Option<OffsetResetProgress>,
    /// When a committed offset last moved (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_commit_time: Option<String>,
    /// Live members: distinct client IDs heartbeating to the group's brokers at the last poll.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<u32>,
    /// What the progress judgement remembers, so that another operator continues it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_window: Option<LagWindowStatus>,
}

/// The runs of polls the Consuming and Stalled conditions are judged on; changes only when lag or
/// committed offsets do.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LagWindowStatus {
    /// Committed offsets summed over the group's queues at the last complete poll.
    pub committed_offsets: u64,
    /// Total lag at the last complete poll.
    pub lag: u64,
    /// Since when lag has been above zero with no commit (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stuck_since: Option<String>,
    /// Since when lag has not gone down at any poll (RFC 3339).
    pub growing_since: String,
    /// Total lag at growingSince.
    pub growing_from: u64,
}

/// Lag of one topic.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopicLagStatus {
    /// Topic name.
    pub topic: String,
    /// Unconsumed messages over queues with a commit; absent when nothing was committed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<u64>,
    /// Milliseconds since the oldest unconsumed message was stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag_latency_millis: Option<u64>,
    /// Queues with no committed offset (lag unknown).
    #[serde(default)]
    pub uncommitted_queues: u32,
}

/// Lag of one queue.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueLagStatus {
    /// Topic name.
    pub topic: String,
    /// Broker name.
    pub broker: String,
    /// Queue id.
    pub queue_id: i32,
    /// Unconsumed messages.
    pub lag: u64,
}

/// A queue with lag and no commit for the whole judgement window.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StalledQueueStatus {
    /// Topic name.
    pub topic: String,
    /// Broker name.
    pub broker: String,
    /// Queue id.
    pub queue_id: i32,
    /// Unconsumed messages.
    pub lag: u64,
    /// The group's committed offset, unmoved since `since`.
    pub committed_offset: u64,
    /// Since when the queue has had lag at every poll and no commit (RFC 3339).
    pub since: String,
}

/// Record of an applied offset reset.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppliedOffsetReset {
    /// The `spec.offsetReset.id` applied.
    pub id: String,
    /// The target applied.
    pub to: OffsetResetTarget,
    /// When it was applied (RFC 3339).
    pub applied_at: String,
    /// Brokers whose reset was interrupted (the operator stopped between the call and its
    /// record) and whose committed offsets moved since: not reset again, so no consumer that
    /// moved past the reset is rewound. Set a new id to reset them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unconfirmed_on: Vec<String>,
}

/// An offset reset part way through its brokers.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OffsetResetProgress {
    /// The `spec.offsetReset.id` being applied.
    pub id: String,
    /// Brokers (addresses) the reset was applied on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applied_on: Vec<String>,
    /// The broker whose reset call was about to be made when this was recorded: its outcome is
    /// unknown until recorded as applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applying: Option<ResetAttempt>,
    /// Brokers whose interrupted reset was not made again (see
    /// `appliedOffsetReset.unconfirmedOn`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unconfirmed_on: Vec<String>,
}

/// A broker's reset call about to be made.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResetAttempt {
    /// The broker's address.
    pub broker: String,
    /// Digest of the group's committed offsets on that broker just before the call: while they
    /// are unchanged, making the call again cannot rewind a consumer that moved past the reset.
    pub offsets_digest: String,
}

impl Broker {
    /// Whether the pause annotation stops reconciliation.
    pub fn is_paused(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(PAUSE_ANNOTATION))
            .is_some_and(|value| value == "true")
    }

    /// The restart token of the `quiver.io/restart` annotation, when set and not empty.
    pub fn restart_token(&self) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(RESTART_ANNOTATION))
            .map(String::as_str)
            .filter(|token| !token.is_empty())
    }

    /// Whether the force annotation lets a scale-down skip the drain.
    pub fn force_scale_down(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|annotations| annotations.get(FORCE_SCALE_DOWN_ANNOTATION))
            .is_some_and(|value| value == "true")
    }

    /// Whether a drain waits for the dead-letter topics (`spec.drain.waitForDeadLetters`).
    pub fn waits_for_dead_letters(&self) -> bool {
        self.spec
            .drain
            .as_ref()
            .is_some_and(|drain| drain.wait_for_dead_letters)
    }

    /// Pods per broker group: `spec.replication.replicas`, 1 without replication.
    pub fn group_size(&self) -> i32 {
        self.spec
            .replication
            .as_ref()
            .map_or(1, |replication| replication.replicas.max(1))
    }

    /// Whether the brokers run as replicated groups (more than one pod each).
    pub fn is_replicated(&self) -> bool {
        self.group_size() > 1
    }

    /// The image to run, falling back to the default.
    pub fn image(&self) -> &str {
        if self.spec.image.is_empty() {
            DEFAULT_IMAGE
        } else {
            &self.spec.image
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::cel::{validate_cel, validate_cel_update};

    fn broker(spec_patch: serde_json::Value) -> Broker {
        let mut value = serde_json::json!({
            "apiVersion": "quiver.io/v1alpha1",
            "kind": "Broker",
            "metadata": {"name": "qb", "namespace": "ns"},
            "spec": {"replicas": 3, "storage": {"size": "10Gi"}},
        });
        merge(&mut value["spec"], spec_patch);
        serde_json::from_value(value).expect("valid broker")
    }

    fn merge(target: &mut serde_json::Value, patch: serde_json::Value) {
        if let (Some(target), serde_json::Value::Object(patch)) = (target.as_object_mut(), patch) {
            for (key, value) in patch {
                match target.get_mut(&key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge(existing, value)
                    }
                    _ => {
                        target.insert(key, value);
                    }
                }
            }
        }
    }

    #[test]
    fn a_minimal_broker_passes_every_rule() {
        validate_cel(&broker(serde_json::json!({}))).expect("valid");
    }

    fn named(name: &str) -> Broker {
        let mut broker = broker(serde_json::json!({}));
        broker.metadata.name = Some(name.to_string());
        broker
    }

    #[test]
    fn a_name_over_the_limit_is_refused_with_the_limit_and_why() {
        let at_limit = "b".repeat(MAX_NAME_LENGTH);
        validate_cel(&named(&at_limit)).expect("a name at the limit is valid");
        let errors = validate_cel(&named(&format!("{at_limit}x"))).unwrap_err();
        let text = format!("{errors:?}");
        assert!(
            text.contains("metadata.name must be at most 51 characters")
                && text.contains("controller-revision-hash"),
            "{text}"
        );
    }

    /// Each name and label value the operator derives from a Broker's name, for pods and groups
    /// up to the largest a StatefulSet's int32 replica count allows, with how Kubernetes checks
    /// it (`Ok` when valid).
    fn derived_names(broker: &Broker) -> Vec<(String, bool)> {
        use crate::desired;
        use crate::testapi::names;
        let last_ordinal = i32::MAX - 1;
        let last_group = i32::MAX / broker.group_size() - 1;
        let statefulset = desired::stateful_set(broker, &desired::RolloutPlan::initial(broker));
        let sts = statefulset.metadata.name.clone().unwrap_or_default();
        let pod = desired::pod_name(broker, last_ordinal);
        let mut checked = vec![
            (format!("statefulset {sts}"), names::is_dns1123_label(&sts)),
            // The StatefulSet controller's revision label: <name>-<hash of up to 10>.
            (
                format!("revision label of {sts}"),
                names::is_label_value(&format!("{sts}-{}", "x".repeat(10))),
            ),
            (
                format!("pod {pod} (its hostname)"),
                names::is_dns1123_label(&pod),
            ),
            (format!("pod-name label {pod}"), names::is_label_value(&pod)),
            (
                format!("config key {pod}.json"),
                format!("{pod}.json").len() <= names::SUBDOMAIN_MAX,
            ),
        ];
        let claim = desired::claim_name(broker, last_ordinal);
        checked.push((
            format!("claim {claim}"),
            names::is_dns1123_subdomain(&claim),
        ));
        let group = desired::group_name(broker, last_group);
        checked.push((
            format!("group label {group}"),
            names::is_label_value(&group),
        ));
        checked.push((
            format!("budget {group}"),
            names::is_dns1123_subdomain(&group),
        ));
        for service in [
            desired::headless_service(broker),
            desired::client_service(broker),
        ] {
            let name = service.metadata.name.unwrap_or_default();
            checked.push((format!("service {name}"), names::is_dns1035_label(&name)));
        }
        let config = desired::config_map(broker, 2, None).metadata.name;
        let config = config.unwrap_or_default();
        checked.push((
            format!("configmap {config}"),
            names::is_dns1123_subdomain(&config),
        ));
        for budget in desired::pod_disruption_budgets(broker, 4) {
            let name = budget.metadata.name.unwrap_or_default();
            checked.push((format!("budget {name}"), names::is_dns1123_subdomain(&name)));
        }
        for (key, value) in desired::labels(broker) {
            checked.push((
                format!("label {key}={value}"),
                names::is_label_value(&value),
            ));
        }
        checked
    }

    #[test]
    fn the_name_limit_is_the_longest_name_whose_objects_are_all_valid() {
        let replicated = |name: &str| {
            let mut broker = named(name);
            broker.metadata.uid = Some("uid-qb".to_string());
            broker.spec.replication = Some(ReplicationSpec {
                replicas: 2,
                ..ReplicationSpec::default()
            });
            broker
        };
        let at_limit = "q".repeat(MAX_NAME_LENGTH);
        let invalid: Vec<String> = derived_names(&replicated(&at_limit))
            .into_iter()
            .filter(|(_, valid)| !valid)
            .map(|(what, _)| what)
            .collect();
        assert_eq!(invalid, Vec::<String>::new());
        let over = format!("{at_limit}q");
        let invalid: Vec<String> = derived_names(&replicated(&over))
            .into_iter()
            .filter(|(_, valid)| !valid)
            .map(|(what, _)| what)
            .collect();
        assert!(
            invalid.iter().any(|what| what.starts_with("group label")),
            "one character more breaks a label: {invalid:?}"
        );
    }

    #[test]
    fn a_name_that_cannot_name_a_service_is_refused() {
        for good in ["qb", "a", "orders-7", "x1"] {
            validate_cel(&named(good)).unwrap_or_else(|e| panic!("{good}: {e:?}"));
        }
        for bad in ["7orders", "orders.eu", "orders-", "Orders", "or_ders"] {
            let errors = validate_cel(&named(bad)).unwrap_err();
            assert!(
                format!("{errors:?}").contains("metadata.name must be a DNS-1035 label"),
                "{bad}: {errors:?}"
            );
        }
    }

    #[test]
    fn zero_replicas_are_rejected() {
        let errors = validate_cel(&broker(serde_json::json!({"replicas": 0}))).unwrap_err();
        assert!(
            format!("{errors:?}").contains("replicas must be at least 1"),
            "{errors:?}"
        );
    }

    #[test]
    fn topic_names_are_checked() {
        let good =
            broker(serde_json::json!({"topics": [{"name": "Orders_v1-%RETRY%", "queues": 4}]}));
        validate_cel(&good).expect("valid topic");
        let bad =
            broker(serde_json::json!({"topics": [{"name": "orders with space", "queues": 4}]}));
        let errors = validate_cel(&bad).unwrap_err();
        assert!(format!("{errors:?}").contains("topic names"), "{errors:?}");
        let no_queues = broker(serde_json::json!({"topics": [{"name": "orders", "queues": 0}]}));
        assert!(validate_cel(&no_queues).is_err());
    }

    #[test]
    fn storage_may_grow_but_not_shrink() {
        let old = broker(serde_json::json!({}));
        validate_cel_update(
            &broker(serde_json::json!({"storage": {"size": "20Gi"}})),
            &old,
        )
        .expect("growth allowed");
        validate_cel_update(
            &broker(serde_json::json!({"storage": {"size": "10240Mi"}})),
            &old,
        )
        .expect("same size in other units allowed");
        let errors = validate_cel_update(
            &broker(serde_json::json!({"storage": {"size": "5Gi"}})),
            &old,
        )
        .unwrap_err();
        assert!(
            format!("{errors:?}").contains("may only grow"),
            "{errors:?}"
        );
    }

    #[test]
    fn disk_high_water_percent_is_a_percentage() {
        let retention = |percent: u8| {
            broker(serde_json::json!({
                "retention": {"fileReservedHours": 72, "diskHighWaterPercent": percent}
            }))
        };
        validate_cel(&retention(85)).expect("85% is valid");
        validate_cel(&retention(100)).expect("100% is valid");
        for bad in [0, 101, 255] {
            let errors = validate_cel(&retention(bad)).unwrap_err();
            assert!(
                format!("{errors:?}").contains("diskHighWaterPercent must be between 1 and 100"),
                "{bad}: {errors:?}"
            );
        }
    }

    #[test]
    fn disk_clean_percentages_are_percentages_and_ordered() {
        let retention = |clean: Option<u8>, force: Option<u8>| {
            let mut retention = serde_json::json!({"fileReservedHours": 72});
            if let Some(clean) = clean {
                retention["diskCleanPercent"] = clean.into();
            }
            if let Some(force) = force {
                retention["diskForceCleanPercent"] = force.into();
            }
            broker(serde_json::json!({ "retention": retention }))
        };
        validate_cel(&retention(Some(75), Some(85))).expect("75 <= 85 is valid");
        validate_cel(&retention(Some(85), Some(85))).expect("equal is valid");
        validate_cel(&retention(Some(60), None)).expect("clean alone below 85 is valid");
        validate_cel(&retention(None, Some(90))).expect("force-clean alone above 75 is valid");
        validate_cel(&retention(Some(95), Some(100))).expect("both high is valid");
        // An absent one counts at the broker's default, which would stop the broker starting.
        for (clean, force) in [(Some(90), Some(80)), (Some(90), None), (None, Some(70))] {
            let errors = validate_cel(&retention(clean, force)).unwrap_err();
            assert!(
                format!("{errors:?}").contains("must not exceed diskForceCleanPercent"),
                "{clean:?} {force:?}: {errors:?}"
            );
        }
        for bad in [0, 101, 255] {
            let errors = validate_cel(&retention(Some(bad), Some(100))).unwrap_err();
            assert!(
                format!("{errors:?}").contains("diskCleanPercent must be between 1 and 100"),
                "{bad}: {errors:?}"
            );
            let errors = validate_cel(&retention(Some(1), Some(bad))).unwrap_err();
            assert!(
                format!("{errors:?}").contains("diskForceCleanPercent must be between 1 and 100"),
                "{bad}: {errors:?}"
            );
        }
    }

    #[test]
    fn storage_size_must_be_a_quantity() {
        let errors =
            validate_cel(&broker(serde_json::json!({"storage": {"size": "lots"}}))).unwrap_err();
        assert!(
            format!("{errors:?}").contains("must be a quantity"),
            "{errors:?}"
        );
    }

    #[test]
    fn storage_class_is_immutable() {
        let old = broker(serde_json::json!({"storage": {"storageClassName": "fast"}}));
        validate_cel_update(&old.clone(), &old).expect("unchanged class allowed");
        let changed = broker(serde_json::json!({"storage": {"storageClassName": "slow"}}));
        let errors = validate_cel_update(&changed, &old).unwrap_err();
        assert!(
            format!("{errors:?}").contains("storageClassName is immutable"),
            "{errors:?}"
        );
        let removed = broker(serde_json::json!({}));
        assert!(validate_cel_update(&removed, &old).is_err());
        let added_later = broker(serde_json::json!({"storage": {"storageClassName": "fast"}}));
        assert!(validate_cel_update(&added_later, &broker(serde_json::json!({}))).is_err());
    }

    fn group(spec: serde_json::Value) -> ConsumerGroup {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "quiver.io/v1alpha1",
            "kind": "ConsumerGroup",
            "metadata": {"name": "billing", "namespace": "ns"},
            "spec": spec,
        }))
        .expect("valid group")
    }

    #[test]
    fn consumer_group_rules() {
        let ok = group(serde_json::json!({"brokerRef": "qb", "topics": ["orders"]}));
        validate_cel(&ok).expect("valid");
        assert_eq!(ok.spec.max_reconsume_times, 16);
        assert!(ok.spec.consume_enable);
        let bad_topic = group(serde_json::json!({"brokerRef": "qb", "topics": ["no/slash"]}));
        assert!(validate_cel(&bad_topic).is_err());
        let moved = group(serde_json::json!({"brokerRef": "other", "topics": ["orders"]}));
        let errors = validate_cel_update(&moved, &ok).unwrap_err();
        assert!(
            format!("{errors:?}").contains("brokerRef is immutable"),
            "{errors:?}"
        );
        let timestamp_missing = group(
            serde_json::json!({"brokerRef": "qb", "offsetReset": {"id": "1", "to": "Timestamp"}}),
        );
        assert!(validate_cel(&timestamp_missing).is_err());
        let timestamp_given = group(
            serde_json::json!({"brokerRef": "qb", "offsetReset": {"id": "1", "to": "Timestamp", "timestampMillis": 1}}),
        );
        validate_cel(&timestamp_given).expect("valid reset");
    }

    #[test]
    fn the_chart_examples_pass_every_rule() {
        for text in [
            include_str!("../../charts/quiver-operator/examples/broker-minimal.yaml"),
            include_str!("../../charts/quiver-operator/examples/broker-production.yaml"),
            include_str!("../../charts/quiver-operator/examples/broker-replicated.yaml"),
            include_str!("../../charts/quiver-operator/examples/broker-secure.yaml"),
        ] {
            let broker: Broker = serde_yaml::from_str(text).expect("example parses");
            validate_cel(&broker).expect("example passes the CEL rules");
        }
        let group: ConsumerGroup = serde_yaml::from_str(include_str!(
            "../../charts/quiver-operator/examples/consumergroup.yaml"
        ))
        .expect("example parses");
        validate_cel(&group).expect("example passes the CEL rules");
    }

    #[test]
    fn acl_needs_admin_credentials_and_tls_has_defaults() {
        let acl_only = broker(serde_json::json!({
            "security": {"acl": {"secretName": "quiver-acl"}}
        }));
        let errors = validate_cel(&acl_only).unwrap_err();
        assert!(
            format!("{errors:?}").contains("security.acl needs security.adminCredentials"),
            "{errors:?}"
        );
        let complete = broker(serde_json::json!({"security": {
            "acl": {"secretName": "quiver-acl"},
            "adminCredentials": {"secretName": "quiver-admin"},
            "tls": {"secretName": "quiver-tls"},
        }}));
        validate_cel(&complete).expect("valid security");
        let security = complete.spec.security.expect("set");
        assert_eq!(security.acl.expect("acl").key, DEFAULT_ACL_KEY);
        let tls = security.tls.expect("tls");
        assert_eq!(
            (tls.mode, tls.client_auth, tls.http),
            (TlsMode::Enforcing, TlsClientAuth::None, false)
        );
        let bad_key = broker(serde_json::json!({"security": {
            "acl": {"secretName": "quiver-acl", "key": "../etc/passwd"},
            "adminCredentials": {"secretName": "quiver-admin"},
        }}));
        assert!(validate_cel(&bad_key).is_err());
    }

    #[test]
    fn replication_defaults_and_bounds() {
        let defaulted = broker(serde_json::json!({"replication": {}}));
        validate_cel(&defaulted).expect("valid");
        assert_eq!(defaulted.spec.replication, Some(ReplicationSpec::default()));
        assert_eq!(defaulted.group_size(), 1);
        assert!(!defaulted.is_replicated());
        assert_eq!(broker(serde_json::json!({})).group_size(), 1);
        let three = broker(serde_json::json!({
            "replication": {"replicas": 3, "mode": "Sync", "minInSyncReplicas": 2}
        }));
        validate_cel(&three).expect("valid");
        assert_eq!(three.group_size(), 3);
        assert_eq!(three.spec.replication.unwrap().mode.flag(), "sync");
        let pointless = broker(serde_json::json!({"replication": {"replicas": 1, "mode": "Sync"}}));
        validate_cel(&pointless).expect("sync with one replica is allowed");
        let errors = validate_cel(&broker(serde_json::json!({
            "replication": {"replicas": 2, "minInSyncReplicas": 3}
        })))
        .unwrap_err();
        assert!(
            format!("{errors:?}").contains("minInSyncReplicas must not exceed"),
            "{errors:?}"
        );
        for (field, message) in [
            ("replicas", "replication.replicas must be at least 1"),
            (
                "minInSyncReplicas",
                "replication.minInSyncReplicas must be at least 1",
            ),
        ] {
            let errors =
                validate_cel(&broker(serde_json::json!({"replication": {field: 0}}))).unwrap_err();
            assert!(format!("{errors:?}").contains(message), "{errors:?}");
        }
    }

    #[test]
    fn replication_replicas_change_only_between_two_or_more_in_one_group() {
        let plain = broker(serde_json::json!({}));
        let one = broker(serde_json::json!({"replication": {"replicas": 1}}));
        let two = broker(serde_json::json!({"replicas": 1, "replication": {"replicas": 2}}));
        let three = broker(serde_json::json!({"replicas": 1, "replication": {"replicas": 3}}));
        validate_cel_update(&one, &plain).expect("absent is one");
        validate_cel_update(&plain, &one).expect("one is absent");
        validate_cel_update(&three, &two).expect("a group grows");
        validate_cel_update(&two, &three).expect("a group shrinks");
        let more_groups = broker(
            serde_json::json!({"replicas": 5, "replication": {"replicas": 3, "mode": "Sync"}}),
        );
        validate_cel_update(&more_groups, &three).expect("groups and mode may change");
        let two_groups_of = |size: i32| {
            broker(serde_json::json!({"replicas": 2, "replication": {"replicas": size}}))
        };
        let refused = [
            (&three, &plain),
            (&plain, &three),
            (&one, &three),
            (&two, &one),
            (&two_groups_of(3), &two_groups_of(2)),
            (&two_groups_of(2), &three),
        ];
        for (new, old) in refused {
            let errors = validate_cel_update(new, old).unwrap_err();
            assert!(
                format!("{errors:?}").contains("replication.replicas may change only between"),
                "{errors:?}"
            );
        }
    }

    #[test]
    fn pause_annotation_is_read() {
        let mut paused = broker(serde_json::json!({}));
        assert!(!paused.is_paused());
        paused.metadata.annotations =
            Some([(PAUSE_ANNOTATION.to_string(), "true".to_string())].into());
        assert!(paused.is_paused());
    }

    #[test]
    fn force_scale_down_annotation_is_read() {
        let mut forced = broker(serde_json::json!({}));
        assert!(!forced.force_scale_down());
        forced.metadata.annotations =
            Some([(FORCE_SCALE_DOWN_ANNOTATION.to_string(), "true".to_string())].into());
        assert!(forced.force_scale_down());
    }

    #[test]
    fn progress_deadline_defaults_to_ten_minutes_and_must_be_positive() {
        let defaulted = broker(serde_json::json!({}));
        assert_eq!(defaulted.spec.progress_deadline_seconds, 600);
        let errors =
            validate_cel(&broker(serde_json::json!({"progressDeadlineSeconds": 0}))).unwrap_err();
        assert!(
            format!("{errors:?}").contains("progressDeadlineSeconds must be at least 1"),
            "{errors:?}"
        );
    }

    #[test]
    fn the_default_image_is_the_operator_release() {
        assert_eq!(
            DEFAULT_IMAGE,
            format!(
                "ghcr.io/quiver-mq/quiver-broker:{}",
                env!("CARGO_PKG_VERSION")
            )
        );
        assert!(!DEFAULT_IMAGE.ends_with(":latest"));
    }
}
