//! The API operations and their semantics: create, get, list, replace, patch (merge, JSON,
//! strategic as merge, server-side apply), delete with finalizers and owner-reference garbage
//! collection; every write goes through one pipeline (isolation, ownership, admission,
//! generation, no-op detection).

use super::admission::{self, Cause};
use super::fields::{self, Scope};
use super::resources::ResourceType;
use super::store::{self, ObjectKey, Store};
use serde_json::{json, Value};

/// An API error, answered as a `metav1.Status`.
#[derive(Clone, Debug, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Value,
}

/// `brokers.quiver.io`, `pods`: how messages name a resource.
fn resource_name(rt: &ResourceType) -> String {
    if rt.group.is_empty() {
        rt.plural.to_string()
    } else {
        format!("{}.{}", rt.plural, rt.group)
    }
}

fn details(rt: &ResourceType, name: &str) -> Value {
    json!({"name": name, "group": rt.group, "kind": rt.plural})
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: Value::Null,
        }
    }

    pub fn not_found(rt: &ResourceType, name: &str) -> ApiError {
        ApiError {
            details: details(rt, name),
            ..ApiError::new(
                404,
                "NotFound",
                format!("{} \"{name}\" not found", resource_name(rt)),
            )
        }
    }

    pub fn already_exists(rt: &ResourceType, name: &str) -> ApiError {
        ApiError {
            details: details(rt, name),
            ..ApiError::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", resource_name(rt)),
            )
        }
    }

    pub fn conflict(rt: &ResourceType, name: &str) -> ApiError {
        let message = format!("Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again", resource_name(rt));
        ApiError {
            details: details(rt, name),
            ..ApiError::new(409, "Conflict", message)
        }
    }

    pub fn forbidden(rt: &ResourceType, name: &str, why: &str) -> ApiError {
        let message = format!("{} \"{name}\" is forbidden: {why}", resource_name(rt));
        ApiError {
            details: details(rt, name),
            ..ApiError::new(403, "Forbidden", message)
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 422 Invalid, one cause per field, as the API server words it.
    pub fn invalid(rt: &ResourceType, object: &Value, causes: Vec<Cause>) -> ApiError {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let kind = if rt.group.is_empty() {
            rt.kind.to_string()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        let messages: Vec<&str> = causes.iter().map(|cause| cause.message.as_str()).collect();
        let listed = if messages.len() == 1 {
            messages[0].to_string()
        } else {
            format!("[{}]", messages.join(", "))
        };
        let causes: Vec<Value> = causes
            .iter()
            .map(|cause| json!({"reason": cause.reason, "message": cause.message, "field": cause.field}))
            .collect();
        ApiError {
            code: 422,
            reason: "Invalid",
            message: format!("{kind} \"{name}\" is invalid: {listed}"),
            details: json!({"name": name, "group": rt.group, "kind": rt.kind, "causes": causes}),
        }
    }

    fn apply_conflicts(rt: &ResourceType, name: &str, conflicts: &[fields::Conflict]) -> ApiError {
        let described: Vec<String> = conflicts
            .iter()
            .map(|conflict| {
                format!(
                    "conflict with \"{}\": {}",
                    conflict.manager,
                    fields::dotted(&conflict.path)
                )
            })
            .collect();
        let plural = if conflicts.len() == 1 { "" } else { "s" };
        let message = format!(
            "Apply failed with {} conflict{plural}: {}",
            conflicts.len(),
            described.join("\n")
        );
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|conflict| json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{}\"", conflict.manager), "field": fields::dotted(&conflict.path)}))
            .collect();
        ApiError {
            details: json!({"name": name, "group": rt.group, "kind": rt.plural, "causes": causes}),
            ..ApiError::new(409, "Conflict", message)
        }
    }

    /// The `metav1.Status` body.
    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if !self.details.is_null() {
            status["details"] = self.details.clone();
        }
        status
    }
}

/// Who owns the fields a write changes.
#[derive(Clone, Copy, Debug)]
pub enum Ownership<'a> {
    /// An Update by this manager: it owns what it changed.
    Update(&'a str),
    /// Server-side apply already recorded ownership.
    Applied,
    /// A controller simulated by the server: ownership untouched.
    System,
}

/// The write scope of `subresource` on `rt`.
pub fn scope_of(rt: &ResourceType, subresource: Option<&str>) -> Scope {
    match (subresource, rt.status_subresource) {
        (Some("status"), _) => Scope::Status,
        (_, true) => Scope::MainWithoutStatus,
        (_, false) => Scope::Everything,
    }
}

fn copy_field(from: &Value, to: &mut Value, field: &str) {
    match from.get(field) {
        Some(value) => to[field] = value.clone(),
        None => {
            if let Some(map) = to.as_object_mut() {
                map.remove(field);
            }
        }
    }
}

/// Keeps what this write may not change: status or everything but status, system metadata.
fn isolate(old: &Value, new: &mut Value, scope: Scope) {
    if scope == Scope::Status {
        let mut result = old.clone();
        copy_field(new, &mut result, "status");
        copy_field(&new["metadata"], &mut result["metadata"], "managedFields");
        *new = result;
        return;
    }
    if scope == Scope::MainWithoutStatus {
        copy_field(old, new, "status");
    }
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "generation",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        copy_field(&old["metadata"], &mut new["metadata"], field);
    }
    copy_field(old, new, "apiVersion");
    copy_field(old, new, "kind");
}

/// Whether `a` and `b` agree on every top-level field but `skipped` (no clones: objects are big).
fn same_except(a: &Value, b: &Value, skipped: &[&str]) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let counted = |map: &serde_json::Map<String, Value>| {
        map.keys()
            .filter(|key| !skipped.contains(&key.as_str()))
            .count()
    };
    counted(a) == counted(b)
        && a.iter()
            .filter(|(key, _)| !skipped.contains(&key.as_str()))
            .all(|(key, value)| b.get(key) == Some(value))
}

/// Whether a generation counts the change: anything but metadata and status.
fn spec_changed(old: &Value, new: &Value) -> bool {
    !same_except(old, new, &["metadata", "status"])
}

/// Whether the write changes anything but the resourceVersion.
fn is_no_op(old: &Value, new: &Value) -> bool {
    same_except(old, new, &["metadata"])
        && same_except(&old["metadata"], &new["metadata"], &["resourceVersion"])
}

fn finalizers_empty(object: &Value) -> bool {
    object["metadata"]["finalizers"]
        .as_array()
        .is_none_or(Vec::is_empty)
}

/// The update pipeline: isolation, ownership, mutation, generation, admission, no-op, commit.
pub fn commit_update(
    store: &mut Store,
    rt: &ResourceType,
    key: &ObjectKey,
    mut new: Value,
    scope: Scope,
    ownership: Ownership<'_>,
    admit: bool,
) -> Result<Value, ApiError> {
    let old = store
        .get(key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt, &key.2))?;
    isolate(&old, &mut new, scope);
    if let Ownership::Update(manager) = ownership {
        fields::record_update(&old, &mut new, manager, scope);
    }
    admission::mutate(store, rt, &mut new, false);
    let generation = old["metadata"]["generation"].as_i64().unwrap_or(1);
    if rt.tracks_generation() && spec_changed(&old, &new) {
        new["metadata"]["generation"] = (generation + 1).into();
    }
    if admit {
        admission::validate(store, rt, &new, Some(&old))?;
    }
    if is_no_op(&old, &new) {
        return Ok(old);
    }
    // The last finalizer gone: the object goes (a terminating pod without any waits for its
    // kubelet instead).
    let released = !finalizers_empty(&old) && finalizers_empty(&new);
    if !new["metadata"]["deletionTimestamp"].is_null() && released {
        store.commit(key, Some(new));
        return Ok(remove_object(store, key, false));
    }
    Ok(store.commit(key, Some(new)))
}

/// The create pipeline: name, namespace, system metadata, ownership, admission, commit.
pub fn commit_create(
    store: &mut Store,
    rt: &'static ResourceType,
    namespace: &str,
    mut object: Value,
    ownership: Ownership<'_>,
    admit: bool,
) -> Result<Value, ApiError> {
    if !object.is_object() {
        return Err(ApiError::bad_request("the body is not an object"));
    }
    let name = object_name(store, &object)?;
    let body_namespace = object["metadata"]["namespace"].as_str().unwrap_or_default();
    if rt.namespaced && !body_namespace.is_empty() && body_namespace != namespace {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let key = store::key(rt, namespace, &name);
    if store.get(&key).is_some() {
        return Err(ApiError::already_exists(rt, &name));
    }
    object["apiVersion"] = rt.api_version().into();
    object["kind"] = rt.kind.into();
    if rt.status_subresource {
        object.as_object_mut().map(|map| map.remove("status"));
    }
    let uid = store.new_uid();
    let metadata = &mut object["metadata"];
    metadata["name"] = name.clone().into();
    if rt.namespaced {
        metadata["namespace"] = namespace.into();
    }
    metadata["uid"] = uid.into();
    metadata["creationTimestamp"] = super::sim_timestamp().into();
    if rt.tracks_generation() {
        metadata["generation"] = 1.into();
    }
    if let Some(metadata) = metadata.as_object_mut() {
        for system in ["deletionTimestamp", "resourceVersion", "generateName"] {
            metadata.remove(system);
        }
    }
    if let Ownership::Update(manager) = ownership {
        fields::record_update(
            &json!({"metadata": {}}),
            &mut object,
            manager,
            scope_of(rt, None),
        );
    }
    admission::mutate(store, rt, &mut object, true);
    if admit {
        admission::validate(store, rt, &object, None)?;
    }
    Ok(store.commit(&key, Some(object)))
}

fn object_name(store: &mut Store, object: &Value) -> Result<String, ApiError> {
    if let Some(name) = object["metadata"]["name"]
        .as_str()
        .filter(|n| !n.is_empty())
    {
        return Ok(name.to_string());
    }
    match object["metadata"]["generateName"].as_str() {
        Some(prefix) => Ok(format!("{prefix}{}", &store.new_uid()[30..])),
        None => Err(ApiError::new(
            422,
            "Invalid",
            "metadata.name: Required value: name or generateName is required",
        )),
    }
}

/// GET of one object.
pub fn get(
    store: &Store,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
) -> Result<Value, ApiError> {
    store
        .get(&store::key(rt, namespace, name))
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt, name))
}

/// A list at the current resourceVersion; no pagination (limit is ignored, no continue).
pub fn list(
    store: &Store,
    rt: &ResourceType,
    namespace: Option<&str>,
    labels: &super::selector::Selector,
    fields: &super::selector::Selector,
) -> Value {
    let items: Vec<Value> = store
        .list(&rt.id(), namespace)
        .into_iter()
        .filter(|object| labels.matches_labels(object) && fields.matches_fields(object))
        .collect();
    json!({
        "apiVersion": rt.api_version(),
        "kind": format!("{}List", rt.kind),
        "metadata": {"resourceVersion": store.resource_version.to_string()},
        "items": items,
    })
}

/// 409 Conflict when `body` names a resourceVersion other than the stored one.
fn check_resource_version(rt: &ResourceType, stored: &Value, body: &Value) -> Result<(), ApiError> {
    match body["metadata"]["resourceVersion"].as_str() {
        Some(wanted)
            if !wanted.is_empty()
                && Some(wanted) != stored["metadata"]["resourceVersion"].as_str() =>
        {
            Err(ApiError::conflict(
                rt,
                stored["metadata"]["name"].as_str().unwrap_or_default(),
            ))
        }
        _ => Ok(()),
    }
}

/// PUT: replace with optimistic concurrency (custom resources must name a resourceVersion).
pub fn replace(
    store: &mut Store,
    rt: &'static ResourceType,
    namespace: &str,
    name: &str,
    subresource: Option<&str>,
    body: Value,
    manager: &str,
) -> Result<Value, ApiError> {
    let key = store::key(rt, namespace, name);
    let stored = store
        .get(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt, name))?;
    if body["metadata"]["name"]
        .as_str()
        .is_some_and(|body_name| body_name != name)
    {
        return Err(ApiError::bad_request(
            "the name of the object does not match the name on the URL",
        ));
    }
    if rt.is_custom()
        && body["metadata"]["resourceVersion"]
            .as_str()
            .is_none_or(str::is_empty)
    {
        let cause = Cause {
            reason: "FieldValueInvalid",
            field: "metadata.resourceVersion".into(),
            message:
                "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
                    .into(),
        };
        return Err(ApiError::invalid(rt, &stored, vec![cause]));
    }
    check_resource_version(rt, &stored, &body)?;
    let scope = scope_of(rt, subresource);
    commit_update(
        store,
        rt,
        &key,
        body,
        scope,
        Ownership::Update(manager),
        true,
    )
}

/// The patch types of the `Content-Type` header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Strategic,
    Json,
    Apply,
}

impl PatchType {
    pub fn from_content_type(content_type: &str) -> Option<PatchType> {
        match content_type.split(';').next().unwrap_or_default().trim() {
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// What a PATCH asked for besides the body.
pub struct PatchRequest<'a> {
    pub patch_type: PatchType,
    pub body: &'a [u8],
    pub manager: Option<&'a str>,
    pub default_manager: &'a str,
    pub force: bool,
}

/// PATCH; true in the result when server-side apply created the object.
pub fn patch(
    store: &mut Store,
    rt: &'static ResourceType,
    namespace: &str,
    name: &str,
    subresource: Option<&str>,
    request: &PatchRequest<'_>,
) -> Result<(Value, bool), ApiError> {
    let key = store::key(rt, namespace, name);
    let scope = scope_of(rt, subresource);
    let parsed: Value = serde_json::from_slice(request.body)
        .or_else(|_| serde_yaml::from_slice(request.body))
        .map_err(|error| ApiError::bad_request(format!("the patch does not parse: {error}")))?;
    if request.patch_type == PatchType::Apply {
        return apply(store, rt, namespace, name, subresource, &parsed, request);
    }
    let stored = store
        .get(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt, name))?;
    let mut patched = stored.clone();
    if request.patch_type == PatchType::Json {
        let parsed = missing_is_null(&patched, parsed);
        let operations: json_patch::Patch = serde_json::from_value(parsed)
            .map_err(|error| ApiError::bad_request(format!("invalid JSON patch: {error}")))?;
        json_patch::patch(&mut patched, &operations).map_err(|error| {
            ApiError::new(
                422,
                "Invalid",
                format!("the JSON patch does not apply: {error}"),
            )
        })?;
    } else {
        check_resource_version(rt, &stored, &parsed)?;
        json_patch::merge(&mut patched, &parsed);
    }
    check_resource_version(rt, &stored, &patched)?;
    let manager = request.manager.unwrap_or(request.default_manager);
    let updated = commit_update(
        store,
        rt,
        &key,
        patched,
        scope,
        Ownership::Update(manager),
        true,
    )?;
    Ok((updated, false))
}

/// The API server's JSON patch (evanphx/json-patch) passes a `test` for null at a missing path,
/// as kube-runtime's finalizer helper relies on; the json-patch crate fails it: drop those.
fn missing_is_null(document: &Value, operations: Value) -> Value {
    let Value::Array(operations) = operations else {
        return operations;
    };
    let kept = operations.into_iter().filter(|operation| {
        let path = operation["path"].as_str().unwrap_or_default();
        !(operation["op"] == "test"
            && operation["value"].is_null()
            && document.pointer(path).is_none())
    });
    Value::Array(kept.collect())
}

fn apply(
    store: &mut Store,
    rt: &'static ResourceType,
    namespace: &str,
    name: &str,
    subresource: Option<&str>,
    applied: &Value,
    request: &PatchRequest<'_>,
) -> Result<(Value, bool), ApiError> {
    let Some(manager) = request.manager.filter(|manager| !manager.is_empty()) else {
        return Err(ApiError::bad_request(
            "PATCH: fieldManager is required for apply requests",
        ));
    };
    let key = store::key(rt, namespace, name);
    let stored = store.get(&key).cloned();
    if let Some(stored) = &stored {
        check_resource_version(rt, stored, applied)?;
    }
    let scope = scope_of(rt, subresource);
    let merged = fields::apply(stored.as_ref(), applied, manager, request.force, scope)
        .map_err(|conflicts| ApiError::apply_conflicts(rt, name, &conflicts))?;
    match stored {
        Some(_) => Ok((
            commit_update(store, rt, &key, merged, scope, Ownership::Applied, true)?,
            false,
        )),
        None if subresource.is_some() => Err(ApiError::not_found(rt, name)),
        None => {
            let mut merged = merged;
            merged["metadata"]["name"] = name.into();
            Ok((
                commit_create(store, rt, namespace, merged, Ownership::Applied, true)?,
                true,
            ))
        }
    }
}

/// DELETE: with finalizers the object only gets a deletionTimestamp; otherwise it goes, and its
/// dependents with it (background propagation; `orphan` keeps them and drops their reference).
pub fn delete(
    store: &mut Store,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
    orphan: bool,
) -> Result<Value, ApiError> {
    let key = store::key(rt, namespace, name);
    let stored = store
        .get(&key)
        .cloned()
        .ok_or_else(|| ApiError::not_found(rt, name))?;
    if rt.kind == "Pod" && !stored["status"]["phase"].is_null() {
        return Ok(terminate_pod(store, &key, stored));
    }
    if finalizers_empty(&stored) {
        return Ok(remove_object(store, &key, orphan));
    }
    if !stored["metadata"]["deletionTimestamp"].is_null() {
        return Ok(stored);
    }
    let mut marked = stored;
    marked["metadata"]["deletionTimestamp"] = super::sim_timestamp().into();
    marked["metadata"]["deletionGracePeriodSeconds"] = 0.into();
    if rt.tracks_generation() {
        let generation = marked["metadata"]["generation"].as_i64().unwrap_or(1);
        marked["metadata"]["generation"] = (generation + 1).into();
    }
    Ok(store.commit(&key, Some(marked)))
}

/// A graceful deletion of a pod the kubelet runs: the deadline (now plus the pod's grace
/// period) as its deletionTimestamp; the kubelet removes it once stopped
/// (`statefulset::kubelet`). Asking again changes nothing.
fn terminate_pod(store: &mut Store, key: &ObjectKey, stored: Value) -> Value {
    if !stored["metadata"]["deletionTimestamp"].is_null() {
        return stored;
    }
    let grace = stored["spec"]["terminationGracePeriodSeconds"]
        .as_i64()
        .unwrap_or(DEFAULT_POD_GRACE_SECONDS);
    let mut marked = stored;
    marked["metadata"]["deletionTimestamp"] = super::sim_timestamp_after(grace).into();
    marked["metadata"]["deletionGracePeriodSeconds"] = grace.into();
    store.commit(key, Some(marked))
}

/// A pod's `terminationGracePeriodSeconds` when its spec sets none.
const DEFAULT_POD_GRACE_SECONDS: i64 = 30;

/// Removes the object for good, then collects its dependents.
pub fn remove_object(store: &mut Store, key: &ObjectKey, orphan: bool) -> Value {
    let removed = store.commit(key, None);
    if let Some(uid) = removed["metadata"]["uid"].as_str() {
        collect_dependents(store, uid, orphan);
    }
    removed
}

fn owner_uids(object: &Value) -> Vec<String> {
    object["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|owner| owner["uid"].as_str().map(str::to_string))
        .collect()
}

/// Garbage collection: a dependent whose owners are all gone is deleted (finalizers honoured,
/// cascading); one with a live owner left only loses the dangling reference.
fn collect_dependents(store: &mut Store, owner_uid: &str, orphan: bool) {
    let dependents: Vec<(ObjectKey, Value)> = store
        .objects
        .iter()
        .filter(|(_, object)| owner_uids(object).iter().any(|uid| uid == owner_uid))
        .map(|(key, object)| (key.clone(), object.clone()))
        .collect();
    for (key, mut dependent) in dependents {
        let live_owner = owner_uids(&dependent).iter().any(|uid| {
            uid != owner_uid
                && store
                    .objects
                    .values()
                    .any(|object| object["metadata"]["uid"].as_str() == Some(uid.as_str()))
        });
        if orphan || live_owner {
            if let Some(owners) = dependent["metadata"]["ownerReferences"].as_array_mut() {
                owners.retain(|owner| owner["uid"].as_str() != Some(owner_uid));
            }
            store.commit(&key, Some(dependent));
            continue;
        }
        let Some(rt) = super::resources::RESOURCES
            .iter()
            .find(|rt| rt.id() == key.0)
        else {
            continue;
        };
        let _ = delete(store, rt, &key.1, &key.2, false);
    }
}
