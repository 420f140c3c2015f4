//! Admission: every object's metadata is validated (its name as its kind requires, its labels);
//! CRD objects are pruned, defaulted and validated against the CRD's OpenAPI schema and its
//! `x-kubernetes-validations` CEL rules (transition rules see `oldSelf`; root rules see
//! `metadata.name` and `metadata.generateName`); built-in kinds get the checks the operator can
//! trip: StatefulSet spec immutability, PVC spec immutability, the PVC resize plugin, and
//! DefaultStorageClass on PVC create.

use super::ops::ApiError;
use super::resources::ResourceType;
use super::store::{self, Store};
use crate::quantity::quantity_bytes;
use kube::core::cel::{apply_defaults, Validator};
use kube::CustomResourceExt;
use serde_json::{json, Value};
use std::sync::OnceLock;

/// The openAPIV3Schema of the CRD of `rt`, if it is one of ours.
pub fn crd_schema(rt: &ResourceType) -> Option<&'static Value> {
    static BROKER: OnceLock<Value> = OnceLock::new();
    static GROUP: OnceLock<Value> = OnceLock::new();
    let schema_of = |crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition| {
        let schema = crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|schema| schema.open_api_v3_schema.as_ref())
            .expect("derived CRD has a schema");
        serde_json::to_value(schema).expect("schema serializes")
    };
    match rt.kind {
        "Broker" if rt.is_custom() => {
            Some(BROKER.get_or_init(|| schema_of(crate::crd::Broker::crd())))
        }
        "ConsumerGroup" if rt.is_custom() => {
            Some(GROUP.get_or_init(|| schema_of(crate::crd::ConsumerGroup::crd())))
        }
        _ => None,
    }
}

/// What the API server does to an object before validating it: prune unknown CRD fields and
/// apply schema defaults; default the storage class of a new PVC.
pub fn mutate(store: &Store, rt: &ResourceType, object: &mut Value, creating: bool) {
    if let Some(schema) = crd_schema(rt) {
        prune_root(schema, object);
        *object = apply_defaults(schema, object);
    }
    if creating
        && rt.kind == "PersistentVolumeClaim"
        && object["spec"]["storageClassName"].is_null()
    {
        if let Some(class) = default_storage_class(store) {
            object["spec"]["storageClassName"] = class.into();
        }
    }
}

/// Validates `new` (replacing `old` on updates); 422 Invalid or 403 Forbidden as the API server.
pub fn validate(
    store: &Store,
    rt: &ResourceType,
    new: &Value,
    old: Option<&Value>,
) -> Result<(), ApiError> {
    invalid_if_any(rt, new, metadata_causes(rt, new))?;
    if let Some(schema) = crd_schema(rt) {
        let mut causes = Vec::new();
        check_schema(schema, new, "", &mut causes);
        if causes.is_empty() {
            causes.extend(cel_causes(schema, new, old));
        }
        return invalid_if_any(rt, new, causes);
    }
    match (rt.kind, old) {
        ("StatefulSet", Some(old)) => statefulset_update(rt, new, old),
        ("PersistentVolumeClaim", Some(old)) => claim_update(store, rt, new, old),
        _ => Ok(()),
    }
}

/// A validation failure of one field.
#[derive(Clone, Debug)]
pub struct Cause {
    pub reason: &'static str,
    pub field: String,
    pub message: String,
}

fn cause(reason: &'static str, field: &str, detail: String) -> Cause {
    Cause {
        reason,
        field: field.to_string(),
        message: format!("{field}: {detail}"),
    }
}

fn invalid_if_any(rt: &ResourceType, object: &Value, causes: Vec<Cause>) -> Result<(), ApiError> {
    if causes.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid(rt, object, causes))
    }
}

/// ObjectMeta validation every kind gets: the name as the kind requires it (a Service's a
/// DNS-1035 label, a StatefulSet's a DNS-1123 label, others a DNS-1123 subdomain) and each
/// label's key and value.
fn metadata_causes(rt: &ResourceType, object: &Value) -> Vec<Cause> {
    let metadata = &object["metadata"];
    let name = metadata["name"].as_str().unwrap_or_default();
    let named = super::names::name_problem(rt.kind, name).map(|problem| {
        cause(
            "FieldValueInvalid",
            "metadata.name",
            format!("Invalid value: \"{name}\": {problem}"),
        )
    });
    let labels = super::names::label_problems(&metadata["labels"])
        .into_iter()
        .map(|(_, problem)| cause("FieldValueInvalid", "metadata.labels", problem));
    named.into_iter().chain(labels).collect()
}

/// What CEL rules see of an object: a real API server shows the root's rules only
/// `metadata.name` and `metadata.generateName` of the metadata.
fn cel_view(object: &Value) -> Value {
    let mut view = object.clone();
    if let Some(metadata) = view["metadata"].as_object_mut() {
        metadata.retain(|key, _| matches!(key.as_str(), "name" | "generateName"));
    }
    view
}

fn cel_causes(schema: &Value, new: &Value, old: Option<&Value>) -> Vec<Cause> {
    thread_local! {
        // Registering the Kubernetes CEL library is not free: once per thread.
        static VALIDATOR: Validator = Validator::new();
    }
    let (new_view, old_view) = (cel_view(new), old.map(cel_view));
    let result =
        VALIDATOR.with(|validator| validator.validate(schema, &new_view, old_view.as_ref()));
    let Err(errors) = result else {
        return Vec::new();
    };
    errors
        .iter()
        .map(|error| {
            let type_name = match super::fields::get(new, &split_path(&error.field_path)) {
                Some(Value::String(_)) => "string",
                Some(Value::Number(_)) => "integer",
                Some(Value::Array(_)) => "array",
                _ => "object",
            };
            // A root rule's error has no field path: the API server prints it as <nil>.
            let field = if error.field_path.is_empty() {
                "<nil>"
            } else {
                error.field_path.as_str()
            };
            cause(
                "FieldValueInvalid",
                field,
                format!("Invalid value: \"{type_name}\": {}", error.message),
            )
        })
        .collect()
}

fn split_path(path: &str) -> Vec<String> {
    path.split('.')
        .filter(|part| !part.is_empty())
        .map(str::to_string)
        .collect()
}

/// Drops fields the schema does not know, as structural pruning does; the root keeps
/// apiVersion, kind and metadata.
fn prune_root(schema: &Value, object: &mut Value) {
    let Some(map) = object.as_object_mut() else {
        return;
    };
    let known = &schema["properties"];
    map.retain(|key, _| {
        matches!(key.as_str(), "apiVersion" | "kind" | "metadata") || known.get(key).is_some()
    });
    for (key, value) in map.iter_mut() {
        if let Some(property) = known.get(key) {
            prune(property, value);
        }
    }
}

fn prune(schema: &Value, value: &mut Value) {
    if schema["x-kubernetes-preserve-unknown-fields"] == true {
        return;
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema["properties"].as_object() {
                map.retain(|key, _| properties.contains_key(key));
                for (key, child) in map.iter_mut() {
                    prune(&properties[key], child);
                }
            } else if let Some(additional) = schema.get("additionalProperties") {
                if additional.is_object() {
                    map.values_mut().for_each(|child| prune(additional, child));
                }
            }
        }
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                items.iter_mut().for_each(|item| prune(item_schema, item));
            }
        }
        _ => {}
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// OpenAPI checks: type, required, enum, minimum/maximum, lengths, item counts; recursive.
fn check_schema(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    if value.is_null() {
        if schema["nullable"] != true && !path.is_empty() {
            causes.push(cause(
                "FieldValueTypeInvalid",
                path,
                format!(
                    "Invalid value: \"null\": {path} in body must be of type {}",
                    schema["type"].as_str().unwrap_or("object")
                ),
            ));
        }
        return;
    }
    if !type_matches(schema, value) {
        let wanted = schema["type"].as_str().unwrap_or_default();
        causes.push(cause(
            "FieldValueTypeInvalid",
            path,
            format!(
                "Invalid value: \"{}\": {path} in body must be of type {wanted}: \"{}\"",
                json_type(value),
                json_type(value)
            ),
        ));
        return;
    }
    check_enum(schema, value, path, causes);
    check_bounds(schema, value, path, causes);
    match value {
        Value::Object(map) => check_object(schema, map, path, causes),
        Value::Array(items) => {
            if let Some(item_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    check_schema(item_schema, item, &format!("{path}[{index}]"), causes);
                }
            }
        }
        _ => {}
    }
}

fn check_object(
    schema: &Value,
    map: &serde_json::Map<String, Value>,
    path: &str,
    causes: &mut Vec<Cause>,
) {
    for required in schema["required"].as_array().into_iter().flatten() {
        let key = required.as_str().unwrap_or_default();
        if !map.contains_key(key) {
            causes.push(cause(
                "FieldValueRequired",
                &join(path, key),
                "Required value".to_string(),
            ));
        }
    }
    let properties = schema["properties"].as_object();
    for (key, child) in map {
        if path.is_empty() && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        let child_schema = properties
            .and_then(|properties| properties.get(key))
            .or_else(|| schema.get("additionalProperties").filter(|s| s.is_object()));
        if let Some(child_schema) = child_schema {
            check_schema(child_schema, child, &join(path, key), causes);
        }
    }
}

fn json_type(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(number) if number.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(schema: &Value, value: &Value) -> bool {
    if schema["x-kubernetes-int-or-string"] == true {
        return value.is_string() || value.is_i64() || value.is_u64();
    }
    match schema["type"].as_str() {
        Some("object") => value.is_object(),
        Some("array") => value.is_array(),
        Some("string") => value.is_string(),
        Some("integer") => value.is_i64() || value.is_u64(),
        Some("number") => value.is_number(),
        Some("boolean") => value.is_boolean(),
        _ => true,
    }
}

fn check_enum(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    let Some(allowed) = schema["enum"].as_array() else {
        return;
    };
    if !allowed.contains(value) {
        let supported: Vec<String> = allowed.iter().map(Value::to_string).collect();
        causes.push(cause(
            "FieldValueNotSupported",
            path,
            format!(
                "Unsupported value: {value}: supported values: {}",
                supported.join(", ")
            ),
        ));
    }
}

fn check_bounds(schema: &Value, value: &Value, path: &str, causes: &mut Vec<Cause>) {
    let invalid = |detail: String| {
        cause(
            "FieldValueInvalid",
            path,
            format!("Invalid value: {value}: {path} in body {detail}"),
        )
    };
    if let (Some(number), Some(minimum)) = (value.as_f64(), schema["minimum"].as_f64()) {
        if number < minimum {
            causes.push(invalid(format!(
                "should be greater than or equal to {minimum}"
            )));
        }
    }
    if let (Some(number), Some(maximum)) = (value.as_f64(), schema["maximum"].as_f64()) {
        if number > maximum {
            causes.push(invalid(format!(
                "should be less than or equal to {maximum}"
            )));
        }
    }
    let length = value
        .as_str()
        .map(|text| text.chars().count())
        .or_else(|| value.as_array().map(Vec::len));
    let Some(length) = length.map(|length| length as u64) else {
        return;
    };
    let max = schema["maxLength"]
        .as_u64()
        .or_else(|| schema["maxItems"].as_u64());
    if let Some(max) = max.filter(|max| length > *max) {
        let reason = if value.is_array() {
            "FieldValueTooMany"
        } else {
            "FieldValueTooLong"
        };
        causes.push(cause(
            reason,
            path,
            format!("Too long: may not be more than {max}"),
        ));
    }
    let min = schema["minLength"]
        .as_u64()
        .or_else(|| schema["minItems"].as_u64());
    if let Some(min) = min.filter(|min| length < *min) {
        causes.push(invalid(format!("should be at least {min} long")));
    }
}

/// StatefulSet spec fields other than these are immutable.
const STATEFULSET_MUTABLE: &[&str] = &[
    "replicas",
    "ordinals",
    "template",
    "updateStrategy",
    "revisionHistoryLimit",
    "persistentVolumeClaimRetentionPolicy",
    "minReadySeconds",
];

fn without(spec: &Value, keys: &[&str]) -> Value {
    let mut spec = spec.clone();
    if let Some(map) = spec.as_object_mut() {
        map.retain(|key, _| !keys.contains(&key.as_str()));
    }
    spec
}

fn statefulset_update(rt: &ResourceType, new: &Value, old: &Value) -> Result<(), ApiError> {
    if without(&new["spec"], STATEFULSET_MUTABLE) == without(&old["spec"], STATEFULSET_MUTABLE) {
        return Ok(());
    }
    let detail = "Forbidden: updates to statefulset spec for fields other than 'replicas', 'ordinals', 'template', 'updateStrategy', 'revisionHistoryLimit', 'persistentVolumeClaimRetentionPolicy' and 'minReadySeconds' are forbidden";
    invalid_if_any(
        rt,
        new,
        vec![cause("FieldValueForbidden", "spec", detail.into())],
    )
}

/// The message of the PersistentVolumeClaimResize admission plugin.
pub const RESIZE_FORBIDDEN: &str = "only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize";

fn claim_update(
    store: &Store,
    rt: &ResourceType,
    new: &Value,
    old: &Value,
) -> Result<(), ApiError> {
    let mutable = |claim: &Value| {
        let mut spec = without(&claim["spec"], &["volumeAttributesClassName"]);
        if let Some(resources) = spec["resources"].as_object_mut() {
            resources.remove("requests");
        }
        spec
    };
    if mutable(new) != mutable(old) {
        let detail = "Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims";
        return invalid_if_any(
            rt,
            new,
            vec![cause("FieldValueForbidden", "spec", detail.into())],
        );
    }
    let requested_storage = |claim: &Value| {
        claim["spec"]["resources"]["requests"]["storage"]
            .as_str()
            .and_then(quantity_bytes)
    };
    let (requested, previous) = (requested_storage(new), requested_storage(old));
    if requested >= previous || requested.is_none() {
        if requested > previous && !class_allows_expansion(store, new) {
            let name = new["metadata"]["name"].as_str().unwrap_or_default();
            return Err(ApiError::forbidden(rt, name, RESIZE_FORBIDDEN));
        }
        return Ok(());
    }
    let detail = "Forbidden: field can not be less than previous value";
    invalid_if_any(
        rt,
        new,
        vec![cause(
            "FieldValueForbidden",
            "spec.resources.requests.storage",
            detail.into(),
        )],
    )
}

fn storage_class(store: &Store, name: &str) -> Option<Value> {
    let rt = super::resources::by_path("storage.k8s.io", "v1", "storageclasses")?;
    store.get(&store::key(rt, "", name)).cloned()
}

fn class_allows_expansion(store: &Store, claim: &Value) -> bool {
    claim["spec"]["storageClassName"]
        .as_str()
        .and_then(|name| storage_class(store, name))
        .is_some_and(|class| class["allowVolumeExpansion"] == true)
}

fn default_storage_class(store: &Store) -> Option<String> {
    let rt = super::resources::by_path("storage.k8s.io", "v1", "storageclasses")?;
    store
        .list(&rt.id(), None)
        .into_iter()
        .find(|class| {
            class["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"]
                == json!("true")
        })
        .and_then(|class| class["metadata"]["name"].as_str().map(str::to_string))
}
