//! The kinds the server serves: API group/version, plural, kind, scope, status subresource.

/// One served resource type.
#[derive(Debug, PartialEq, Eq)]
pub struct ResourceType {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// API version.
    pub version: &'static str,
    /// URL plural.
    pub plural: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Namespaced (else cluster-scoped).
    pub namespaced: bool,
    /// Has a status subresource: main-resource writes ignore status, /status writes only status.
    pub status_subresource: bool,
}

impl ResourceType {
    /// `apiVersion` as objects carry it: `v1`, `apps/v1`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// Storage key prefix: `apiVersion/plural`.
    pub fn id(&self) -> String {
        format!("{}/{}", self.api_version(), self.plural)
    }

    /// Whether objects carry `metadata.generation` (ConfigMaps, Services, Leases, Events and
    /// claims do not).
    pub fn tracks_generation(&self) -> bool {
        self.is_custom() || matches!(self.kind, "StatefulSet" | "PodDisruptionBudget" | "Pod")
    }

    /// Whether this is one of the CRDs (admitted against their schema).
    pub fn is_custom(&self) -> bool {
        self.group == crate::crd::GROUP
    }
}

const fn served(
    group: &'static str,
    version: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
    status_subresource: bool,
) -> ResourceType {
    ResourceType {
        group,
        version,
        plural,
        kind,
        namespaced,
        status_subresource,
    }
}

/// Every served resource type.
pub static RESOURCES: &[ResourceType] = &[
    served("quiver.io", "v1alpha1", "brokers", "Broker", true, true),
    served(
        "quiver.io",
        "v1alpha1",
        "consumergroups",
        "ConsumerGroup",
        true,
        true,
    ),
    served("apps", "v1", "statefulsets", "StatefulSet", true, true),
    served("", "v1", "services", "Service", true, true),
    served("", "v1", "configmaps", "ConfigMap", true, false),
    served("", "v1", "secrets", "Secret", true, false),
    served("", "v1", "pods", "Pod", true, true),
    served(
        "",
        "v1",
        "persistentvolumeclaims",
        "PersistentVolumeClaim",
        true,
        true,
    ),
    served("", "v1", "events", "Event", true, false),
    served("events.k8s.io", "v1", "events", "Event", true, false),
    served(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        true,
        true,
    ),
    served(
        "networking.k8s.io",
        "v1",
        "networkpolicies",
        "NetworkPolicy",
        true,
        false,
    ),
    served("coordination.k8s.io", "v1", "leases", "Lease", true, false),
    served(
        "storage.k8s.io",
        "v1",
        "storageclasses",
        "StorageClass",
        false,
        false,
    ),
];

/// The resource type at `group/version/plural`.
pub fn by_path(group: &str, version: &str, plural: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|rt| rt.group == group && rt.version == version && rt.plural == plural)
}

/// The resource type of an object's `apiVersion` and `kind`.
pub fn by_kind(api_version: &str, kind: &str) -> Option<&'static ResourceType> {
    RESOURCES
        .iter()
        .find(|rt| rt.api_version() == api_version && rt.kind == kind)
}

/// The resource type of a kube-rs type.
pub fn of<K: kube::Resource<DynamicType = ()>>() -> &'static ResourceType {
    let api_version = K::api_version(&());
    let kind = K::kind(&());
    by_kind(&api_version, &kind).unwrap_or_else(|| panic!("{api_version} {kind} is not served"))
}
