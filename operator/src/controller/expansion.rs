//! Volume expansion: the claims grow to spec.storage.size in place, but only when their
//! StorageClass allows it; a refusal or a rejected claim patch is a condition, not a failed
//! reconcile (CEL forbids shrinking the spec back, so a hard failure would repeat forever).

use super::conditions::Desired;
use super::error_chain;
use crate::crd::{Broker, StorageStatus};
use crate::desired::RolloutPlan;
use crate::quantity::quantity_bytes;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Patch, PatchParams};
use kube::Api;
use std::collections::BTreeMap;

/// Condition type, present while spec.storage.size exceeds the claim template.
pub const CONDITION: &str = "VolumeExpansion";
/// Reason: the claims' StorageClass does not set allowVolumeExpansion: true.
pub const REASON_FORBIDDEN: &str = "StorageClassForbidsExpansion";
/// Reason: no StorageClass by that name, or no default one.
pub const REASON_CLASS_NOT_FOUND: &str = "StorageClassNotFound";
/// Reason: the StorageClasses could not be read.
pub const REASON_CLASS_UNREADABLE: &str = "StorageClassUnreadable";
/// Reason: the API server refused a claim patch.
pub const REASON_REJECTED: &str = "ExpansionRejected";
/// Reason: claims requested bigger, not all resized yet.
pub const REASON_EXPANDING: &str = "Expanding";
/// Reason: every claim has the requested capacity.
pub const REASON_EXPANDED: &str = "VolumesExpanded";
/// Annotation marking the cluster's default StorageClass.
pub const DEFAULT_CLASS_ANNOTATION: &str = "storageclass.kubernetes.io/is-default-class";

/// What the expansion step found this pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Expansion {
    /// Progress, when an expansion is asked for.
    pub storage: Option<StorageStatus>,
    /// The VolumeExpansion condition, when an expansion is asked for.
    pub condition: Option<Desired>,
    /// The claims whose capacity has not reached the requested size yet.
    pub behind: Vec<ClaimBehind>,
}

/// A claim still smaller than spec.storage.size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimBehind {
    /// The claim's name.
    pub name: String,
    /// Its capacity as the claim's status reports it; None while it reports none.
    pub capacity: Option<String>,
}

impl Expansion {
    /// Claims are being resized and nothing refused it.
    pub fn in_progress(&self) -> bool {
        self.condition
            .as_ref()
            .is_some_and(|condition| condition.reason == REASON_EXPANDING)
    }

    /// Why the expansion is past its deadline, naming each claim still behind: the Degraded
    /// message once no claim was resized for `deadline_s` seconds.
    pub fn overdue_message(&self, deadline_s: i64) -> String {
        let requested = self
            .storage
            .as_ref()
            .map_or("spec.storage.size", |storage| storage.requested.as_str());
        let behind: Vec<String> = self
            .behind
            .iter()
            .map(|claim| match &claim.capacity {
                Some(capacity) => format!("claim {} still has {capacity}", claim.name),
                None => format!("claim {} reports no capacity", claim.name),
            })
            .collect();
        format!(
            "volume expansion to {requested} made no progress for more than {deadline_s}s \
             (spec.progressDeadlineSeconds): {}; the claims' conditions and events (kubectl \
             describe pvc) show the storage driver's error",
            behind.join(", ")
        )
    }
}

/// The StorageClass named `name`, or the cluster default when `name` is None.
pub fn storage_class<'a>(
    name: Option<&str>,
    classes: &'a [StorageClass],
) -> Option<&'a StorageClass> {
    match name {
        Some(name) => classes
            .iter()
            .find(|class| class.metadata.name.as_deref() == Some(name)),
        None => classes.iter().find(|class| {
            class
                .metadata
                .annotations
                .as_ref()
                .and_then(|annotations| annotations.get(DEFAULT_CLASS_ANNOTATION))
                .is_some_and(|value| value == "true")
        }),
    }
}

/// None when the class allows expansion, else the refusing condition.
pub fn refusal(name: Option<&str>, classes: &[StorageClass], size: &str) -> Option<Desired> {
    let described = name.map_or("the default StorageClass".to_string(), |name| {
        format!("StorageClass {name}")
    });
    let Some(class) = storage_class(name, classes) else {
        return Some(Desired::new(
            CONDITION,
            false,
            REASON_CLASS_NOT_FOUND,
            format!("{described} does not exist, so the claims cannot grow to {size}"),
        ));
    };
    if class.allow_volume_expansion == Some(true) {
        return None;
    }
    let class_name = class.metadata.name.as_deref().unwrap_or_default();
    Some(Desired::new(
        CONDITION,
        false,
        REASON_FORBIDDEN,
        format!(
            "StorageClass {class_name} does not allow volume expansion (allowVolumeExpansion is \
             not true): the claims keep their size instead of growing to {size}; a cluster \
             administrator can set allowVolumeExpansion: true on the class"
        ),
    ))
}

/// The progress condition once nothing refused the expansion.
pub fn progress(requested: &str, resized: i32, total: i32) -> Desired {
    if resized >= total {
        Desired::new(
            CONDITION,
            true,
            REASON_EXPANDED,
            format!("every claim has {requested}"),
        )
    } else {
        Desired::new(
            CONDITION,
            true,
            REASON_EXPANDING,
            format!("{resized}/{total} claims resized to {requested}"),
        )
    }
}

fn storage_of(quantities: Option<&BTreeMap<String, Quantity>>) -> u128 {
    quantities
        .and_then(|q| q.get("storage"))
        .and_then(|q| quantity_bytes(&q.0))
        .unwrap_or(0)
}

fn requested_bytes(claim: &PersistentVolumeClaim) -> u128 {
    storage_of(
        claim
            .spec
            .as_ref()
            .and_then(|spec| spec.resources.as_ref())
            .and_then(|resources| resources.requests.as_ref()),
    )
}

fn capacity_bytes(claim: &PersistentVolumeClaim) -> u128 {
    storage_of(
        claim
            .status
            .as_ref()
            .and_then(|status| status.capacity.as_ref()),
    )
}

/// The claims whose capacity is below `wanted` bytes, with what they report.
fn behind(claims: &[PersistentVolumeClaim], wanted: u128) -> Vec<ClaimBehind> {
    claims
        .iter()
        .filter(|claim| capacity_bytes(claim) < wanted)
        .map(|claim| ClaimBehind {
            name: claim.metadata.name.clone().unwrap_or_default(),
            capacity: claim
                .status
                .as_ref()
                .and_then(|status| status.capacity.as_ref())
                .and_then(|capacity| capacity.get("storage"))
                .map(|quantity| quantity.0.clone()),
        })
        .collect()
}

/// The bytes spec.storage.size asks for, when that is more than the claim template's
/// `claim_size` (an expansion is asked for); None otherwise.
pub fn growth(requested: &str, claim_size: &str) -> Option<u128> {
    let (wanted, template) = (quantity_bytes(requested)?, quantity_bytes(claim_size)?);
    (wanted > template).then_some(wanted)
}

/// The claims that request less than `wanted` bytes.
pub fn to_grow(
    claims: &[PersistentVolumeClaim],
    wanted: u128,
) -> impl Iterator<Item = &PersistentVolumeClaim> {
    claims.iter().filter(move |c| requested_bytes(c) < wanted)
}

/// The expansion of `claims` (the claims of `replicas` brokers that exist) to spec.storage.size,
/// pure: its progress and condition, and the claims to patch (empty when the StorageClass
/// refuses, or nothing is left to grow). `classes` are the StorageClasses as read, None when
/// not read, or why they could not be.
pub fn plan(
    broker: &Broker,
    plan: &RolloutPlan,
    claims: &[PersistentVolumeClaim],
    classes: Option<&Result<Vec<StorageClass>, String>>,
) -> (Expansion, Vec<String>) {
    let requested = &broker.spec.storage.size;
    let Some(wanted) = growth(requested, &plan.claim_size) else {
        return (Expansion::default(), Vec::new());
    };
    let storage = Some(StorageStatus {
        requested: requested.clone(),
        resized_claims: claims
            .iter()
            .filter(|c| capacity_bytes(c) >= wanted)
            .count() as i32,
        total_claims: plan.replicas,
    });
    let to_grow: Vec<&PersistentVolumeClaim> = to_grow(claims, wanted).collect();
    if let Some(first) = to_grow.first() {
        // The claim's own class is what the volume has; the spec's is what it was created from.
        let class_name = first
            .spec
            .as_ref()
            .and_then(|spec| spec.storage_class_name.clone())
            .or_else(|| broker.spec.storage.storage_class_name.clone());
        let refused = match classes {
            Some(Ok(classes)) => refusal(class_name.as_deref(), classes, requested),
            Some(Err(error)) => Some(unreadable(error)),
            None => None,
        };
        if let Some(refused) = refused {
            let expansion = Expansion {
                storage,
                condition: Some(refused),
                behind: behind(claims, wanted),
            };
            return (expansion, Vec::new());
        }
    }
    let resized = storage.as_ref().map_or(0, |s| s.resized_claims);
    let expansion = Expansion {
        condition: Some(progress(requested, resized, plan.replicas)),
        storage,
        behind: behind(claims, wanted),
    };
    let names = to_grow
        .iter()
        .map(|claim| claim.metadata.name.clone().unwrap_or_default())
        .collect();
    (expansion, names)
}

/// The condition when the StorageClasses could not be read.
fn unreadable(error: &str) -> Desired {
    Desired::new(
        CONDITION,
        false,
        REASON_CLASS_UNREADABLE,
        format!("cannot read StorageClasses to check volume expansion: {error}"),
    )
}

/// Patches each claim to `size`; returns the rejection condition when any patch failed.
pub async fn patch_claims(
    claims: &Api<PersistentVolumeClaim>,
    to_grow: &[String],
    size: &str,
) -> Option<Desired> {
    let mut rejected = Vec::new();
    let patch = serde_json::json!({"spec": {"resources": {"requests": {"storage": size}}}});
    for name in to_grow {
        match claims
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => tracing::info!(claim = %name, %size, "requested volume expansion"),
            Err(error) => rejected.push(format!("{name}: {}", error_chain(&error))),
        }
    }
    (!rejected.is_empty()).then(|| {
        Desired::new(
            CONDITION,
            false,
            REASON_REJECTED,
            format!("claim patch refused: {}", rejected.join("; ")),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn class(name: &str, default: bool, allow: Option<bool>) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                annotations: default.then(|| {
                    BTreeMap::from([(DEFAULT_CLASS_ANNOTATION.to_string(), "true".to_string())])
                }),
                ..ObjectMeta::default()
            },
            allow_volume_expansion: allow,
            provisioner: "csi.example".to_string(),
            ..StorageClass::default()
        }
    }

    #[test]
    fn a_named_class_allowing_expansion_passes() {
        let classes = [
            class("standard", true, None),
            class("fast", false, Some(true)),
        ];
        assert_eq!(refusal(Some("fast"), &classes, "20Gi"), None);
    }

    #[test]
    fn the_default_class_is_checked_when_none_is_named() {
        let classes = [
            class("fast", false, Some(true)),
            class("standard", true, None),
        ];
        let refused = refusal(None, &classes, "20Gi").expect("standard refuses");
        assert_eq!(
            (refused.status, refused.reason),
            (super::super::conditions::Status::False, REASON_FORBIDDEN)
        );
        assert!(
            refused.message.contains("StorageClass standard"),
            "{}",
            refused.message
        );
        let explicit_false = [class("standard", true, Some(false))];
        assert!(refusal(None, &explicit_false, "20Gi").is_some());
    }

    #[test]
    fn a_missing_class_is_named() {
        let refused = refusal(Some("gone"), &[], "20Gi").expect("refused");
        assert_eq!(refused.reason, REASON_CLASS_NOT_FOUND);
        assert!(
            refused.message.contains("StorageClass gone"),
            "{}",
            refused.message
        );
        let no_default = refusal(None, &[class("fast", false, Some(true))], "20Gi").unwrap();
        assert!(no_default.message.contains("the default StorageClass"));
    }

    #[test]
    fn progress_counts_resized_claims() {
        assert_eq!(progress("20Gi", 1, 3).reason, REASON_EXPANDING);
        assert_eq!(progress("20Gi", 3, 3).reason, REASON_EXPANDED);
    }
}
