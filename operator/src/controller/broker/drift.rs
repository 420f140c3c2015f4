//! Changes made to the StatefulSet's pod template behind the operator (`kubectl edit sts`,
//! `kubectl rollout restart sts`), found from its managedFields, pure.
//!
//! The operator applies the template with server-side apply, forced, so it takes back every
//! field it sets; a field it does not set (an env var added, a template annotation such as
//! `kubectl.kubernetes.io/restartedAt`) stays, owned by whoever wrote it, and rolls the pods
//! outside the operator's stepping. Such a field is a path under `spec.template` that another
//! field manager owns and the operator's own entries do not: a field both own holds the
//! operator's value, so it is no drift.

use crate::controller::rollout::REVISION_LABEL;
use crate::crd::Broker;
use crate::desired::{self, FIELD_MANAGER};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::{Map, Value};

/// Fields of the pod template another field manager wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Drift {
    /// The field manager (kubectl edit's is `kubectl-edit`, rollout restart's `kubectl-rollout`).
    pub manager: String,
    /// The fields, readable: `spec.template.spec.containers[name=broker].env[name=X]`.
    pub fields: Vec<String>,
}

/// Paths shown per manager in a message.
const SHOWN_FIELDS: usize = 5;

/// The drift of `sts`'s pod template: per other field manager, the template fields it owns that
/// the operator does not. Empty when the template is the operator's alone.
pub fn template_drift(sts: &StatefulSet) -> Vec<Drift> {
    let entries = sts.metadata.managed_fields.as_deref().unwrap_or_default();
    let template = |entry: &ManagedFieldsEntry| -> Option<Value> {
        let fields = entry.fields_v1.as_ref()?;
        fields.0.get("f:spec")?.get("f:template").cloned()
    };
    let ours: Vec<Value> = entries
        .iter()
        .filter(|entry| entry.manager.as_deref() == Some(FIELD_MANAGER))
        .filter_map(template)
        .collect();
    entries
        .iter()
        .filter(|entry| entry.manager.as_deref() != Some(FIELD_MANAGER))
        .filter(|entry| entry.subresource.as_deref().unwrap_or_default().is_empty())
        .filter_map(|entry| {
            let mut paths = Vec::new();
            leaf_paths(&template(entry)?, &mut Vec::new(), &mut paths);
            let fields: Vec<String> = paths
                .into_iter()
                .filter(|path| !ours.iter().any(|owned| covers(owned, path)))
                .map(|path| readable(&path))
                .fold(Vec::new(), |mut unique, field| {
                    if !unique.contains(&field) {
                        unique.push(field);
                    }
                    unique
                });
            let fields = outermost(fields);
            let manager = entry.manager.clone().unwrap_or_default();
            (!fields.is_empty()).then_some(Drift { manager, fields })
        })
        .collect()
}

/// `fields` without those inside another of them (a list item's `.name` beside the item).
fn outermost(fields: Vec<String>) -> Vec<String> {
    let inside = |field: &String, outer: &String| {
        field.len() > outer.len()
            && field.starts_with(outer.as_str())
            && matches!(field.as_bytes()[outer.len()], b'.' | b'[')
    };
    fields
        .iter()
        .filter(|field| !fields.iter().any(|outer| inside(field, outer)))
        .cloned()
        .collect()
}

/// The leaf paths of a FieldsV1 tree: keys down to an empty map.
fn leaf_paths(node: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let children: Option<&Map<String, Value>> = node.as_object().filter(|map| !map.is_empty());
    let Some(children) = children else {
        out.push(prefix.clone());
        return;
    };
    for (key, child) in children {
        prefix.push(key.clone());
        leaf_paths(child, prefix, out);
        prefix.pop();
    }
}

/// Whether the FieldsV1 tree `owned` owns `path`: it holds the path, or a leaf above it (an
/// atomic field owned whole).
fn covers(owned: &Value, path: &[String]) -> bool {
    let mut node = owned;
    for key in path {
        match node.as_object() {
            Some(map) if map.is_empty() => return true,
            Some(map) => match map.get(key) {
                Some(child) => node = child,
                None => return false,
            },
            None => return false,
        }
    }
    true
}

/// `["f:spec", "f:containers", "k:{\"name\":\"broker\"}", "f:env", "."]` as
/// `spec.template.spec.containers[name=broker].env`.
fn readable(path: &[String]) -> String {
    let mut text = "spec.template".to_string();
    for key in path {
        if let Some(field) = key.strip_prefix("f:") {
            text.push('.');
            text.push_str(field);
        } else if let Some(item) = key.strip_prefix("k:") {
            let pairs: Vec<String> = serde_json::from_str::<Map<String, Value>>(item)
                .map(|map| {
                    map.iter()
                        .map(|(name, value)| match value.as_str() {
                            Some(text) => format!("{name}={text}"),
                            None => format!("{name}={value}"),
                        })
                        .collect()
                })
                .unwrap_or_else(|_| vec![item.to_string()]);
            text.push_str(&format!("[{}]", pairs.join(",")));
        } else if let Some(value) = key.strip_prefix("v:") {
            text.push_str(&format!("[{value}]"));
        }
    }
    text
}

/// The JSON merge patch (RFC 7386) that turns `from` into `to`: maps merged key by key, a key
/// `to` lacks set to null (removed), anything else `to`'s value (lists replaced whole).
pub fn merge_patch(from: &Value, to: &Value) -> Value {
    match (from, to) {
        (Value::Object(from), Value::Object(to)) => {
            let mut patch: Map<String, Value> = to
                .iter()
                .map(|(key, value)| {
                    let merged = match from.get(key) {
                        Some(old) => merge_patch(old, value),
                        None => value.clone(),
                    };
                    (key.clone(), merged)
                })
                .collect();
            for gone in from.keys().filter(|key| !to.contains_key(*key)) {
                patch.insert(gone.clone(), Value::Null);
            }
            Value::Object(patch)
        }
        _ => to.clone(),
    }
}

/// The Warning event's note for `drift`, naming the pods rolled outside the operator.
pub fn describe(sts_name: &str, drift: &[Drift], rolled: &[String]) -> String {
    let each: Vec<String> = drift
        .iter()
        .map(|drift| {
            let mut fields: Vec<&str> = drift.fields.iter().map(String::as_str).collect();
            let more = fields.len().saturating_sub(SHOWN_FIELDS);
            fields.truncate(SHOWN_FIELDS);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            format!("by {}: {}{more}", drift.manager, fields.join(", "))
        })
        .collect();
    let rolled = if rolled.is_empty() {
        String::new()
    } else {
        format!(
            "; {} rolled outside the operator, restarted back one at a time",
            rolled.join(", ")
        )
    };
    format!(
        "StatefulSet {sts_name}'s pod template was changed outside the operator ({}); restored \
         to the Broker's template{rolled}. Change the Broker instead; to restart the brokers, \
         set the quiver.io/restart annotation on it",
        each.join("; ")
    )
}

/// The pods running neither the StatefulSet's current revision nor its update revision as it
/// stood before the drift (the current one, while no rollout of the operator's is going on):
/// rolled by the StatefulSet controller to the drifted template. By name.
pub fn rolled_outside(broker: &Broker, sts: &StatefulSet, pods: &[Pod]) -> Vec<String> {
    let Some(current) = sts
        .status
        .as_ref()
        .and_then(|status| status.current_revision.as_deref())
    else {
        return Vec::new();
    };
    let replicas = sts.spec.replicas.unwrap_or(0);
    (0..replicas)
        .rev()
        .map(|ordinal| desired::pod_name(broker, ordinal))
        .filter(|name| {
            pods.iter().any(|pod| {
                pod.metadata.name.as_deref() == Some(name.as_str())
                    && pod
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|labels| labels.get(REVISION_LABEL))
                        .is_some_and(|revision| revision != current)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::FieldsV1;
    use serde_json::json;

    fn entry(manager: &str, operation: &str, fields: Value) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(operation.into()),
            fields_type: Some("FieldsV1".into()),
            fields_v1: Some(FieldsV1(fields)),
            ..ManagedFieldsEntry::default()
        }
    }

    fn sts(entries: Vec<ManagedFieldsEntry>) -> StatefulSet {
        let mut sts = StatefulSet::default();
        sts.metadata.managed_fields = Some(entries);
        sts
    }

    fn ours() -> ManagedFieldsEntry {
        entry(
            FIELD_MANAGER,
            "Apply",
            json!({"f:spec": {"f:replicas": {}, "f:template": {
                "f:metadata": {"f:annotations": {"f:quiver.io/template-hash": {}}},
                "f:spec": {"f:containers": {"k:{\"name\":\"broker\"}": {
                    ".": {}, "f:image": {}, "f:env": {"k:{\"name\":\"POD_NAME\"}": {".": {}, "f:name": {}}}}}}}}}),
        )
    }

    #[test]
    fn an_env_var_added_by_kubectl_edit_is_drift() {
        let edit = entry(
            "kubectl-edit",
            "Update",
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"broker\"}": {"f:env": {"k:{\"name\":\"DEBUG\"}": {".": {}, "f:name": {}, "f:value": {}}}}}}}}}),
        );
        let drift = template_drift(&sts(vec![ours(), edit]));
        assert_eq!(drift.len(), 1);
        assert_eq!(drift[0].manager, "kubectl-edit");
        assert_eq!(
            drift[0].fields,
            ["spec.template.spec.containers[name=broker].env[name=DEBUG]"],
            "the item named once, not each of its fields"
        );
    }

    #[test]
    fn a_rollout_restart_annotation_is_drift() {
        let restart = entry(
            "kubectl-rollout",
            "Update",
            json!({"f:spec": {"f:template": {"f:metadata": {"f:annotations": {
                "f:kubectl.kubernetes.io/restartedAt": {}}}}}}),
        );
        let drift = template_drift(&sts(vec![ours(), restart]));
        assert_eq!(
            drift[0].fields,
            ["spec.template.metadata.annotations.kubectl.kubernetes.io/restartedAt"]
        );
        let note = describe("qb", &drift, &["qb-2".to_string()]);
        assert!(note.contains("by kubectl-rollout: spec.template.metadata.annotations.kubectl.kubernetes.io/restartedAt"), "{note}");
        assert!(note.contains("qb-2 rolled outside the operator"), "{note}");
    }

    #[test]
    fn fields_the_operator_owns_too_replicas_and_status_writers_are_no_drift() {
        let shared = entry(
            "other-applier",
            "Apply",
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                "k:{\"name\":\"broker\"}": {"f:image": {}}}}}}}),
        );
        let scale = entry("kubectl", "Update", json!({"f:spec": {"f:replicas": {}}}));
        let mut status = entry(
            "kube-controller-manager",
            "Update",
            json!({"f:status": {"f:replicas": {}}}),
        );
        status.subresource = Some("status".into());
        assert!(template_drift(&sts(vec![ours(), shared, scale, status])).is_empty());
    }

    #[test]
    fn the_merge_patch_removes_what_was_added_and_replaces_lists() {
        let drifted = json!({"metadata": {"annotations": {"quiver.io/template-hash": "a",
            "kubectl.kubernetes.io/restartedAt": "now"}},
            "spec": {"containers": [{"name": "broker", "env": [{"name": "DEBUG"}]}]}});
        let ours = json!({"metadata": {"annotations": {"quiver.io/template-hash": "a"}},
            "spec": {"containers": [{"name": "broker"}]}});
        let patch = merge_patch(&drifted, &ours);
        assert_eq!(
            patch["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"],
            Value::Null
        );
        assert_eq!(patch["spec"]["containers"], ours["spec"]["containers"]);
        let mut patched = drifted.clone();
        json_patch::merge(&mut patched, &patch);
        assert_eq!(patched, ours);
    }

    #[test]
    fn an_atomic_field_owned_whole_covers_what_is_below_it() {
        let mine = entry(
            FIELD_MANAGER,
            "Apply",
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}}),
        );
        let other = entry(
            "someone",
            "Apply",
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {}}}}}),
        );
        assert!(template_drift(&sts(vec![mine, other.clone()])).is_empty());
        assert_eq!(
            template_drift(&sts(vec![other]))[0].fields,
            ["spec.template.spec.containers"]
        );
    }
}
