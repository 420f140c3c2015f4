//! The StatefulSet of a Broker: its pod template (broker container, probes, Secrets'
//! volumes, default spread), update strategy, volume claim template and the hashes that roll
//! the pods when the template, the config or the Secrets change.
//!
//! Pod management is Parallel, with every ordering the operator's own. Broker groups must not
//! wait on each other: under OrderedReady the StatefulSet creates, replaces and removes pods one
//! at a time in ordinal order and halts at the first pod that is not Ready, so a crash-looping
//! pod of group 0 keeps group 1 from starting (and from scaling), and after a full outage the
//! brokers come back one at a time, each waiting for the one before to pass its readiness
//! probe (a store recovery each). Parallel starts and replaces every pod at once. Nothing is
//! lost for rollouts: podManagementPolicy does not change how a StatefulSet updates, and the
//! operator already orders them itself (a partition stepped down one Ready pod at a time
//! without replication; OnDelete and [`crate::controller::rollout::next_group_step`], each
//! group on its own, with it). One StatefulSet per group was the other way: it would also let
//! each group carry its own zone spread, but it renames every pod and claim (`<name>-<ordinal>`
//! becomes `<name>-g<g>-<replica>`), so existing Brokers could not keep their data without a
//! copy, and the broker names, peer lists, budgets and drains built on ordinals would all
//! change. podManagementPolicy is immutable: a StatefulSet an older operator created with
//! OrderedReady is deleted with orphan propagation (its pods and claims stay) once it is at
//! rest (no drain, rollout or start under way; until then applies keep OrderedReady) and
//! created again, adopting the pods; its template is the same, so no pod restarts (the
//! `StatefulSetReplaced` event says so; [`recreate_reason`]).

use super::*;

/// StatefulSet running the brokers, with the pod template hash annotation set.
pub fn stateful_set(broker: &Broker, plan: &RolloutPlan) -> StatefulSet {
    let mut template = pod_template(broker);
    let annotations = &mut template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .annotations;
    if let Some(security_hash) = &plan.security_hash {
        *annotations = Some(BTreeMap::from([(
            SECURITY_HASH_ANNOTATION.to_string(),
            security_hash.clone(),
        )]));
    }
    // A new restart token is a template change: the rollout restarts the pods.
    if let Some(token) = broker.restart_token() {
        annotations.get_or_insert_with(BTreeMap::new).insert(
            crate::crd::RESTART_ANNOTATION.to_string(),
            token.to_string(),
        );
    }
    // The drain marks and the pod count are left out: they must not restart the brokers that
    // stay.
    let hash = template_hash(&template, &rolling_config(broker));
    template
        .metadata
        .get_or_insert_with(ObjectMeta::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(TEMPLATE_HASH_ANNOTATION.to_string(), hash);
    let retention = match broker.spec.storage.retention_policy {
        VolumeRetentionPolicy::Retain => "Retain",
        VolumeRetentionPolicy::Delete => "Delete",
    };
    StatefulSet {
        metadata: metadata(broker, broker.name_any()),
        spec: StatefulSetSpec {
            replicas: Some(plan.replicas),
            service_name: Some(headless_service_name(broker)),
            selector: LabelSelector {
                match_labels: Some(selector_labels(broker)),
                ..LabelSelector::default()
            },
            pod_management_policy: Some(POD_MANAGEMENT_POLICY.to_string()),
            update_strategy: Some(update_strategy(broker, plan)),
            persistent_volume_claim_retention_policy: Some(
                StatefulSetPersistentVolumeClaimRetentionPolicy {
                    when_deleted: Some(retention.to_string()),
                    when_scaled: Some(retention.to_string()),
                },
            ),
            template,
            volume_claim_templates: Some(vec![volume_claim_template(broker, &plan.claim_size)]),
            ..StatefulSetSpec::default()
        },
        ..StatefulSet::default()
    }
}

/// The StatefulSet's podManagementPolicy (module docs).
pub const POD_MANAGEMENT_POLICY: &str = "Parallel";

/// Why `existing` cannot take the desired StatefulSet by an apply and must be created again
/// (a field the API server keeps immutable differs), None when it can.
pub fn recreate_reason(existing: &StatefulSet) -> Option<String> {
    // Absent, the API server's default.
    let policy = existing
        .spec
        .pod_management_policy
        .as_deref()
        .unwrap_or("OrderedReady");
    (policy != POD_MANAGEMENT_POLICY).then(|| {
        format!("podManagementPolicy {policy} becomes {POD_MANAGEMENT_POLICY}, which a StatefulSet cannot change")
    })
}

/// Without replication a partitioned rolling update (highest ordinal first); with it OnDelete:
/// the operator restarts a group's replicas first and switches mastership over before deleting
/// the old master ([`crate::controller::rollout::next_group_step`]), an order no partition gives.
fn update_strategy(broker: &Broker, plan: &RolloutPlan) -> StatefulSetUpdateStrategy {
    if broker.is_replicated() {
        return StatefulSetUpdateStrategy {
            type_: Some("OnDelete".to_string()),
            rolling_update: None,
        };
    }
    StatefulSetUpdateStrategy {
        type_: Some("RollingUpdate".to_string()),
        rolling_update: Some(RollingUpdateStatefulSetStrategy {
            partition: Some(plan.partition),
            max_unavailable: Some(IntOrString::Int(1)),
        }),
    }
}

/// The config whose change rolls the pods: pod 0's file without `peers` and `group-members`,
/// standing for every pod's. Neither list may roll a pod: a `spec.replicas` or
/// `spec.replication.replicas` change must start or stop only the pods it adds or removes.
/// A running broker re-reads `peers` from its file when the kubelet refreshes it (the
/// ConfigMap is mounted whole, no subPath); the members of a group learn a membership change
/// through consensus, and a broker checks `group-members` against its stored membership only
/// at start. Rolling for either would cost every broker a restart (and a replicated group a
/// switchover and a catch-up per member) for nothing. Every other key of any pod's file is the
/// same function of the spec as pod 0's, or follows from the pod's ordinal alone (its name,
/// address and replica id), so pod 0's file changes whenever any pod's would roll.
fn rolling_config(broker: &Broker) -> ConfigMap {
    // One representative file: hashing every pod's file would change with the pod count.
    let mut settings = broker_settings(broker, 0, 1);
    settings.peers.clear();
    settings.group_members.clear();
    let text = settings_json(&settings).to_string();
    ConfigMap {
        data: Some(BTreeMap::from([(pod_name(broker, 0), text)])),
        ..ConfigMap::default()
    }
}

/// The hash recorded on the pod template: changes when the template or the config changes.
pub fn template_hash(template: &PodTemplateSpec, config: &ConfigMap) -> String {
    let text = serde_json::to_string(&(template, &config.data)).expect("objects serialize");
    format!("{:016x}", fnv1a64(text.as_bytes()))
}

/// The hash of the Secrets' data recorded in [`SECURITY_HASH_ANNOTATION`]: SHA-1 over each
/// Secret's name, then its keys and values in key order (a digest, so the annotation tells
/// nothing of the data).
pub fn security_hash<'a>(
    secrets: impl IntoIterator<Item = (&'a str, &'a BTreeMap<String, Vec<u8>>)>,
) -> String {
    use sha1::{Digest, Sha1};
    let mut hasher = Sha1::new();
    for (name, data) in secrets {
        hasher.update((name.len() as u64).to_le_bytes());
        hasher.update(name.as_bytes());
        for (key, value) in data {
            hasher.update((key.len() as u64).to_le_bytes());
            hasher.update(key.as_bytes());
            hasher.update((value.len() as u64).to_le_bytes());
            hasher.update(value);
        }
    }
    hasher
        .finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// FNV-1a: stable across Rust versions, unlike `DefaultHasher`.
fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn volume_claim_template(broker: &Broker, size: &str) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(DATA_VOLUME.to_string()),
            labels: Some(selector_labels(broker)),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_string()]),
            storage_class_name: broker.spec.storage.storage_class_name.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity(size.to_string()),
                )])),
                ..VolumeResourceRequirements::default()
            }),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    }
}

/// The broker container: non-root, read-only root, probes on the broker's HTTP port.
fn broker_container(broker: &Broker) -> Container {
    let security = broker.spec.security.clone().unwrap_or_default();
    let mut args = vec!["--config".to_string(), CONFIG_FILE_ARG.to_string()];
    args.extend(security_args(&security));
    let mut env = vec![EnvVar {
        name: "POD_NAME".to_string(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: "metadata.name".to_string(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    }];
    env.extend(peer_credentials_env(&security));
    let mut volume_mounts = vec![
        VolumeMount {
            name: DATA_VOLUME.to_string(),
            mount_path: DATA_DIR.to_string(),
            ..VolumeMount::default()
        },
        VolumeMount {
            name: "config".to_string(),
            mount_path: CONFIG_DIR.to_string(),
            read_only: Some(true),
            ..VolumeMount::default()
        },
    ];
    volume_mounts.extend(
        security_volumes(&security)
            .into_iter()
            .map(|(volume, dir)| VolumeMount {
                name: volume.name,
                mount_path: dir.to_string(),
                read_only: Some(true),
                ..VolumeMount::default()
            }),
    );
    let https = security.tls.as_ref().is_some_and(|tls| tls.http);
    Container {
        name: "broker".to_string(),
        image: Some(broker.image().to_string()),
        args: Some(args),
        env: Some(env),
        ports: Some(vec![
            container_port("remoting", REMOTING_PORT),
            container_port("grpc", GRPC_PORT),
            container_port("http", HTTP_PORT),
        ]),
        resources: broker.spec.resources.clone(),
        readiness_probe: Some(http_probe("/readyz", 5, 3, https)),
        liveness_probe: Some(http_probe("/healthz", 10, 6, https)),
        // Recovery of a large CommitLog may take minutes; liveness starts after it.
        startup_probe: Some(http_probe("/healthz", 5, 120, https)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            run_as_non_root: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_string()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(volume_mounts),
        ..Container::default()
    }
}

/// The broker flags of `spec.security`: the ACL file and the TLS material in their mounts.
fn security_args(security: &SecuritySpec) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(acl) = &security.acl {
        args.extend(["--acl-file".to_string(), format!("{ACL_DIR}/{}", acl.key)]);
    }
    if let Some(tls) = &security.tls {
        let mode = match tls.mode {
            TlsMode::Permissive => "permissive",
            TlsMode::Enforcing => "enforcing",
        };
        let client_auth = match tls.client_auth {
            TlsClientAuth::None => "none",
            TlsClientAuth::Optional => "optional",
            TlsClientAuth::Require => "require",
        };
        let file = |key: &str| format!("{TLS_DIR}/{key}");
        args.extend([
            "--tls-mode".to_string(),
            mode.to_string(),
            "--tls-cert-file".to_string(),
            file(TLS_CERT_KEY),
            "--tls-key-file".to_string(),
            file(TLS_KEY_KEY),
        ]);
        // Without client certificates the broker needs no CA, and a Secret without ca.crt
        // (a certificate from a public issuer) still works.
        if tls.client_auth != TlsClientAuth::None {
            args.extend(["--tls-ca-file".to_string(), file(TLS_CA_KEY)]);
        }
        args.extend(["--tls-client-auth".to_string(), client_auth.to_string()]);
        if tls.http {
            args.push("--http-tls".to_string());
        }
    }
    args
}

/// The admin account, from its Secret, signs the brokers' polls of their peers: with ACL on,
/// unsigned polls would be refused.
fn peer_credentials_env(security: &SecuritySpec) -> Vec<EnvVar> {
    let Some(admin) = &security.admin_credentials else {
        return Vec::new();
    };
    let from_secret = |name: &str, key: &str| EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource {
            secret_key_ref: Some(SecretKeySelector {
                name: admin.secret_name.clone(),
                key: key.to_string(),
                optional: Some(false),
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    vec![
        from_secret("QUIVER_PEER_ACCESS_KEY", ACCESS_KEY_KEY),
        from_secret("QUIVER_PEER_SECRET_KEY", SECRET_KEY_KEY),
    ]
}

/// The Secret volumes of `spec.security` and their mount directories. Whole Secrets, not
/// subPath mounts: kubelet updates their files in place and the broker reloads them.
fn security_volumes(security: &SecuritySpec) -> Vec<(Volume, &'static str)> {
    let secret_volume = |name: &str, secret_name: &str| Volume {
        name: name.to_string(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret_name.to_string()),
            // Readable by the broker's group (fsGroup) only.
            default_mode: Some(0o440),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mut volumes = Vec::new();
    if let Some(acl) = &security.acl {
        volumes.push((secret_volume("acl", &acl.secret_name), ACL_DIR));
    }
    if let Some(tls) = &security.tls {
        volumes.push((secret_volume("tls", &tls.secret_name), TLS_DIR));
    }
    volumes
}

/// The pod's security context: UID/GID 65532 (distroless nonroot), RuntimeDefault seccomp.
fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        run_as_group: Some(65532),
        fs_group: Some(65532),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

/// Seconds a stopping broker gets unless spec.podTemplate says: a member of a replicated group
/// first hands mastership to an in-sync replica (at most the broker's
/// `shutdown-switchover-timeout-ms`, which the operator leaves at its default), then stops as
/// any broker does within [`DEFAULT_TERMINATION_GRACE_SECONDS`]; rounded up, never below
/// Kubernetes' default of 30 s.
pub fn termination_grace_seconds(broker: &Broker) -> i64 {
    let handover_ms = if broker.is_replicated() {
        quiver_broker_config::defaults::SHUTDOWN_SWITCHOVER_TIMEOUT_MS
    } else {
        0
    };
    let handover = i64::try_from(handover_ms.div_ceil(1000)).unwrap_or(i64::MAX);
    (DEFAULT_TERMINATION_GRACE_SECONDS.saturating_add(handover))
        .max(KUBERNETES_DEFAULT_GRACE_SECONDS)
}

fn pod_template(broker: &Broker) -> PodTemplateSpec {
    let overrides = broker.spec.pod_template.clone().unwrap_or_default();
    let affinity = overrides
        .affinity
        .clone()
        .unwrap_or_else(|| default_affinity(broker));
    let topology_spread = if overrides.topology_spread_constraints.is_empty() {
        default_spread(broker)
    } else {
        overrides.topology_spread_constraints.clone()
    };
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels(broker)),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            containers: vec![broker_container(broker)],
            security_context: Some(pod_security_context()),
            termination_grace_period_seconds: Some(
                overrides
                    .termination_grace_period_seconds
                    .unwrap_or_else(|| termination_grace_seconds(broker)),
            ),
            automount_service_account_token: Some(false),
            affinity: Some(affinity),
            topology_spread_constraints: Some(topology_spread),
            tolerations: (!overrides.tolerations.is_empty()).then(|| overrides.tolerations.clone()),
            node_selector: (!overrides.node_selector.is_empty())
                .then(|| overrides.node_selector.clone()),
            volumes: Some(pod_volumes(broker)),
            ..PodSpec::default()
        }),
    }
}

fn pod_volumes(broker: &Broker) -> Vec<Volume> {
    let config = Volume {
        name: "config".to_string(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map_name(broker),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    };
    let security = broker.spec.security.clone().unwrap_or_default();
    std::iter::once(config)
        .chain(
            security_volumes(&security)
                .into_iter()
                .map(|(volume, _)| volume),
        )
        .collect()
}

fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_string()),
        container_port: port,
        protocol: Some("TCP".to_string()),
        ..ContainerPort::default()
    }
}

/// A probe of the HTTP port; kubelet does not verify the certificate of an HTTPS probe.
fn http_probe(path: &str, period_seconds: i32, failure_threshold: i32, https: bool) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::String("http".to_string()),
            scheme: https.then(|| "HTTPS".to_string()),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period_seconds),
        failure_threshold: Some(failure_threshold),
        timeout_seconds: Some(2),
        ..Probe::default()
    }
}

fn default_affinity(broker: &Broker) -> Affinity {
    Affinity {
        pod_anti_affinity: Some(PodAntiAffinity {
            preferred_during_scheduling_ignored_during_execution: Some(vec![
                WeightedPodAffinityTerm {
                    weight: 100,
                    pod_affinity_term: PodAffinityTerm {
                        label_selector: Some(LabelSelector {
                            match_labels: Some(selector_labels(broker)),
                            ..LabelSelector::default()
                        }),
                        topology_key: "kubernetes.io/hostname".to_string(),
                        ..PodAffinityTerm::default()
                    },
                },
            ]),
            ..PodAntiAffinity::default()
        }),
        ..Affinity::default()
    }
}

/// Brokers spread across zones. A replicated Broker's pods also spread across nodes: maxSkew
/// 1 over the Broker's pods (created at once, so balanced over the Broker, not per group: one
/// template cannot single a group's pods out).
fn default_spread(broker: &Broker) -> Vec<TopologySpreadConstraint> {
    let mut spread = vec![spread_over(broker, "topology.kubernetes.io/zone")];
    if broker.is_replicated() {
        spread.push(spread_over(broker, "kubernetes.io/hostname"));
    }
    spread
}

fn spread_over(broker: &Broker, topology_key: &str) -> TopologySpreadConstraint {
    TopologySpreadConstraint {
        max_skew: 1,
        topology_key: topology_key.to_string(),
        when_unsatisfiable: "ScheduleAnyway".to_string(),
        label_selector: Some(LabelSelector {
            match_labels: Some(selector_labels(broker)),
            ..LabelSelector::default()
        }),
        ..TopologySpreadConstraint::default()
    }
}
