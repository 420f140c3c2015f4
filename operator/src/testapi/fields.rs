//! Field ownership (metadata.managedFields) and server-side apply.
//!
//! Ownership is per leaf path. Objects are walked; lists follow their schema's list type as the
//! API server's structured merge does for built-in kinds ([`list_type`]): an associative list
//! (containers, env, ports, volumes, volumeMounts, ownerReferences...) is walked item by item,
//! each item named by its keys (`k:{"name":"broker"}`) and owned as such (FieldsV1's `"."`); a
//! set (finalizers) is owned value by value (`v:"a"`); every other list, and every list of a
//! custom resource (our CRDs declare no list types), is atomic, one leaf. Applies merge
//! associative lists by key and sets by value, so a field another manager added to an item
//! survives an apply that does not name it. Each manager entry is keyed by (manager, operation,
//! subresource) and serialized as FieldsV1 (`{"f:spec": {"f:replicas": {}}}`).

use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

/// A field path, e.g. `["spec", "replicas"]`.
pub type FieldPath = Vec<String>;

/// Which part of an object a write may touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The main resource of a kind with a status subresource: everything but status.
    MainWithoutStatus,
    /// The main resource of a kind without a status subresource: everything.
    Everything,
    /// The status subresource: status only.
    Status,
}

impl Scope {
    fn subresource(self) -> &'static str {
        match self {
            Scope::Status => "status",
            _ => "",
        }
    }

    /// Whether ownership of `path` is tracked in this scope.
    fn tracks(self, path: &[String]) -> bool {
        let first = path.first().map(String::as_str);
        let tracked_metadata = |path: &[String]| {
            matches!(
                path.get(1).map(String::as_str),
                Some("labels" | "annotations" | "finalizers" | "ownerReferences")
            )
        };
        match (self, first) {
            (_, None | Some("apiVersion" | "kind")) => false,
            (Scope::Status, Some(first)) => first == "status",
            (_, Some("metadata")) => tracked_metadata(path),
            (Scope::MainWithoutStatus, Some("status")) => false,
            _ => true,
        }
    }
}

/// One managedFields entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub manager: String,
    pub operation: String,
    pub subresource: String,
    pub api_version: String,
    pub fields: BTreeSet<FieldPath>,
}

/// A field another manager owns with a different value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conflict {
    pub manager: String,
    pub path: FieldPath,
}

/// `.spec.replicas`, `.spec.containers[name="broker"].image`, as conflict messages print paths.
pub fn dotted(path: &[String]) -> String {
    path.iter()
        .map(|part| match ItemRef::parse(part) {
            Some(ItemRef::Keys(keys)) => {
                let keys: Vec<String> = keys.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("[{}]", keys.join(","))
            }
            Some(ItemRef::Value(value)) => format!("[={value}]"),
            None => format!(".{part}"),
        })
        .collect()
}

/// How the API server merges a list: its schema's `x-kubernetes-list-type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListType {
    /// Replaced whole, owned as one field.
    Atomic,
    /// Scalars merged by value (`listType: set`).
    Set,
    /// Objects merged by these key fields (`listType: map`, `x-kubernetes-list-map-keys`).
    Map(&'static [&'static str]),
}

/// The list type at `fields` (the path's field names, list items left out) of a built-in kind
/// (`custom`: one of our CRDs, whose lists are atomic but for metadata's), as the Kubernetes
/// OpenAPI schema declares it for the kinds the operator writes.
pub fn list_type(custom: bool, fields: &[&str]) -> ListType {
    const CONTAINERS: [&str; 3] = ["containers", "initContainers", "ephemeralContainers"];
    let last = fields.last().copied().unwrap_or_default();
    let parent = fields.len().checked_sub(2).map(|at| fields[at]);
    match (fields, parent, last) {
        (["metadata", "finalizers"], _, _) => ListType::Set,
        (["metadata", "ownerReferences"], _, _) => ListType::Map(&["uid"]),
        _ if custom => ListType::Atomic,
        (_, _, last) if CONTAINERS.contains(&last) => ListType::Map(&["name"]),
        (_, Some(parent), "env") if CONTAINERS.contains(&parent) => ListType::Map(&["name"]),
        (_, Some(parent), "volumeMounts") if CONTAINERS.contains(&parent) => {
            ListType::Map(&["mountPath"])
        }
        (_, Some(parent), "volumeDevices") if CONTAINERS.contains(&parent) => {
            ListType::Map(&["devicePath"])
        }
        (_, Some(parent), "ports") if CONTAINERS.contains(&parent) => {
            ListType::Map(&["containerPort", "protocol"])
        }
        (["spec", "ports"], _, _) => ListType::Map(&["port", "protocol"]),
        (_, Some("spec"), "volumes" | "imagePullSecrets") => ListType::Map(&["name"]),
        (_, Some("spec"), "topologySpreadConstraints") => {
            ListType::Map(&["topologyKey", "whenUnsatisfiable"])
        }
        (["status", "conditions"], _, _) => ListType::Map(&["type"]),
        _ => ListType::Atomic,
    }
}

/// Whether `object` is one of our custom resources (its lists are atomic).
fn is_custom(object: &Value) -> bool {
    let group = format!("{}/", crate::crd::GROUP);
    object["apiVersion"]
        .as_str()
        .is_some_and(|api_version| api_version.starts_with(&group))
}

/// A path part naming a list item: by its keys (`k:{"name":"broker"}`) or its value (`v:"a"`).
enum ItemRef {
    Keys(Map<String, Value>),
    Value(Value),
}

impl ItemRef {
    fn parse(part: &str) -> Option<ItemRef> {
        if let Some(keys) = part.strip_prefix("k:") {
            return serde_json::from_str(keys).ok().map(ItemRef::Keys);
        }
        let value = part.strip_prefix("v:")?;
        serde_json::from_str(value).ok().map(ItemRef::Value)
    }

    fn matches(&self, item: &Value) -> bool {
        match self {
            ItemRef::Keys(keys) => keys
                .iter()
                .all(|(key, wanted)| key_value(item, key) == *wanted),
            ItemRef::Value(value) => item == value,
        }
    }
}

/// A key field of a list item; a port's protocol defaults to TCP, as the API server defaults it.
fn key_value(item: &Value, key: &str) -> Value {
    match item.get(key) {
        Some(value) => value.clone(),
        None if key == "protocol" => Value::String("TCP".to_string()),
        None => Value::Null,
    }
}

/// The path part naming `item` of a list of `list_type`.
fn item_part(list_type: ListType, item: &Value) -> String {
    match list_type {
        ListType::Map(keys) => {
            let keys: Map<String, Value> = keys
                .iter()
                .map(|key| (key.to_string(), key_value(item, key)))
                .collect();
            format!("k:{}", Value::Object(keys))
        }
        _ => format!("v:{item}"),
    }
}

/// Whether `path` names a list item (owned as present, whatever its content).
fn is_item(path: &[String]) -> bool {
    path.last()
        .is_some_and(|part| part.starts_with("k:") || part.starts_with("v:"))
}

/// Whether a change at `changed` takes `owned` from its manager: a field at, under or above
/// it, but a list item only when the item itself (or what holds it) changed, not a field in it.
fn takes(changed: &[String], owned: &[String]) -> bool {
    owned.starts_with(changed) || (changed.starts_with(owned) && !is_item(owned))
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// Whether `path` differs between `a` and `b`: a list item by presence, a field by value.
fn differs(a: &Value, b: &Value, path: &[String]) -> bool {
    if is_item(path) {
        get(a, path).is_some() != get(b, path).is_some()
    } else {
        get(a, path) != get(b, path)
    }
}

fn child<'a>(value: &'a Value, part: &str) -> Option<&'a Value> {
    match (value, ItemRef::parse(part)) {
        (Value::Array(items), Some(item)) => items.iter().find(|each| item.matches(each)),
        _ => value.get(part),
    }
}

fn child_mut<'a>(value: &'a mut Value, part: &str) -> Option<&'a mut Value> {
    match ItemRef::parse(part) {
        Some(item) if value.is_array() => value
            .as_array_mut()?
            .iter_mut()
            .find(|each| item.matches(each)),
        _ => value.get_mut(part),
    }
}

/// The value at `path`, if present.
pub fn get<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter()
        .try_fold(value, |value, part| child(value, part))
}

fn remove(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let parent = parents
        .iter()
        .try_fold(value, |value, part| child_mut(value, part));
    match (parent, ItemRef::parse(last)) {
        (Some(Value::Array(items)), Some(item)) => items.retain(|each| !item.matches(each)),
        (Some(Value::Object(map)), _) => {
            map.remove(last);
        }
        _ => {}
    }
}

/// Removes `path`, then the maps it leaves empty (below the top level) that `applied` does not
/// name: the manager owned those maps too, as FieldsV1 `"."` entries record.
fn remove_with_empty_parents(value: &mut Value, path: &[String], applied: &Value) {
    remove(value, path);
    for depth in (2..path.len()).rev() {
        let parent = &path[..depth];
        if is_item(parent) {
            // An item goes only when its manager stops naming it (its own path is dropped).
            break;
        }
        let empty =
            get(value, parent).is_some_and(|node| node.as_object().is_some_and(Map::is_empty));
        if !empty || get(applied, parent).is_some() {
            break;
        }
        remove(value, parent);
    }
}

/// Where a walk of an object is: the path so far, and its field names alone (for
/// [`list_type`]).
struct Walk<'a> {
    custom: bool,
    path: FieldPath,
    fields: Vec<&'a str>,
}

impl<'a> Walk<'a> {
    fn list_type(&self) -> ListType {
        list_type(self.custom, &self.fields)
    }

    fn leaves(&mut self, value: &'a Value, out: &mut BTreeSet<FieldPath>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, child) in map {
                    self.path.push(key.clone());
                    self.fields.push(key);
                    self.leaves(child, out);
                    self.fields.pop();
                    self.path.pop();
                }
            }
            Value::Array(items) if !items.is_empty() && self.list_type() != ListType::Atomic => {
                let list_type = self.list_type();
                for item in items {
                    self.path.push(item_part(list_type, item));
                    out.insert(self.path.clone());
                    if matches!(list_type, ListType::Map(_)) {
                        self.leaves(item, out);
                    }
                    self.path.pop();
                }
            }
            _ => {
                out.insert(self.path.clone());
            }
        }
    }
}

/// Leaf paths of `value` tracked in `scope`: fields, and the items of associative lists and
/// sets (each item's own path, then its fields).
pub fn leaves(value: &Value, scope: Scope) -> BTreeSet<FieldPath> {
    let mut out = BTreeSet::new();
    let mut walk = Walk {
        custom: is_custom(value),
        path: Vec::new(),
        fields: Vec::new(),
    };
    walk.leaves(value, &mut out);
    out.retain(|path| scope.tracks(path));
    out
}

/// The managedFields entries of `object`.
pub fn read_entries(object: &Value) -> Vec<Entry> {
    let Some(entries) = object["metadata"]["managedFields"].as_array() else {
        return Vec::new();
    };
    entries
        .iter()
        .map(|entry| Entry {
            manager: entry["manager"].as_str().unwrap_or_default().to_string(),
            operation: entry["operation"].as_str().unwrap_or_default().to_string(),
            subresource: entry["subresource"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            api_version: entry["apiVersion"].as_str().unwrap_or_default().to_string(),
            fields: decode(&entry["fieldsV1"]),
        })
        .collect()
}

/// Replaces the managedFields of `object` with `entries` (dropping empty ones).
pub fn write_entries(object: &mut Value, entries: &[Entry]) {
    let encoded: Vec<Value> = entries
        .iter()
        .filter(|entry| !entry.fields.is_empty())
        .map(|entry| {
            let mut value = json!({
                "manager": entry.manager,
                "operation": entry.operation,
                "apiVersion": entry.api_version,
                "fieldsType": "FieldsV1",
                "fieldsV1": encode(&entry.fields),
            });
            if !entry.subresource.is_empty() {
                value["subresource"] = entry.subresource.clone().into();
            }
            value
        })
        .collect();
    if let Some(metadata) = object["metadata"].as_object_mut() {
        if encoded.is_empty() {
            metadata.remove("managedFields");
        } else {
            metadata.insert("managedFields".into(), Value::Array(encoded));
        }
    }
}

fn encode(fields: &BTreeSet<FieldPath>) -> Value {
    let mut root = Value::Object(Map::new());
    for path in fields {
        let mut node = &mut root;
        for part in path {
            let key = if ItemRef::parse(part).is_some() {
                part.clone()
            } else {
                format!("f:{part}")
            };
            node = node
                .as_object_mut()
                .expect("FieldsV1 nodes are objects")
                .entry(key)
                .or_insert_with(|| Value::Object(Map::new()));
        }
        if is_item(path) {
            // FieldsV1 marks the item itself as owned, beside the fields in it.
            if let Some(node) = node.as_object_mut() {
                node.insert(".".to_string(), Value::Object(Map::new()));
            }
        }
    }
    root
}

fn decode(fields: &Value) -> BTreeSet<FieldPath> {
    fn walk(node: &Value, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        let Some(map) = node.as_object() else { return };
        if (map.is_empty() || map.contains_key(".")) && !prefix.is_empty() {
            out.insert(prefix.clone());
        }
        for (key, child) in map {
            let part = match key.strip_prefix("f:") {
                Some(field) => field.to_string(),
                None if ItemRef::parse(key).is_some() => key.clone(),
                None => continue,
            };
            prefix.push(part);
            walk(child, prefix, out);
            prefix.pop();
        }
    }
    let mut out = BTreeSet::new();
    walk(fields, &mut Vec::new(), &mut out);
    out
}

fn entry_mut<'a>(
    entries: &'a mut Vec<Entry>,
    manager: &str,
    operation: &str,
    scope: Scope,
    api_version: &str,
) -> &'a mut Entry {
    let subresource = scope.subresource();
    let found = entries.iter().position(|entry| {
        entry.manager == manager && entry.operation == operation && entry.subresource == subresource
    });
    let index = found.unwrap_or_else(|| {
        entries.push(Entry {
            manager: manager.to_string(),
            operation: operation.to_string(),
            subresource: subresource.to_string(),
            api_version: api_version.to_string(),
            fields: BTreeSet::new(),
        });
        entries.len() - 1
    });
    &mut entries[index]
}

/// Records an Update by `manager`: it owns every field it changed, others lose them.
pub fn record_update(old: &Value, new: &mut Value, manager: &str, scope: Scope) {
    let mut entries = read_entries(old);
    let mut candidates = leaves(old, scope);
    candidates.extend(leaves(new, scope));
    let changed: Vec<FieldPath> = candidates
        .into_iter()
        .filter(|path| differs(old, new, path))
        .collect();
    if changed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    for entry in entries.iter_mut() {
        entry
            .fields
            .retain(|owned| !changed.iter().any(|path| takes(path, owned)));
    }
    let api_version = new["apiVersion"].as_str().unwrap_or_default().to_string();
    let owner = entry_mut(&mut entries, manager, "Update", scope, &api_version);
    owner
        .fields
        .extend(changed.into_iter().filter(|path| get(new, path).is_some()));
    write_entries(new, &entries);
}

/// Server-side apply of `applied` by `manager` onto `old` (absent on create): the merged object,
/// or the conflicts with other managers when `force` is false.
pub fn apply(
    old: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    scope: Scope,
) -> Result<Value, Vec<Conflict>> {
    let base = old.cloned().unwrap_or_else(|| json!({"metadata": {}}));
    let mut entries = read_entries(&base);
    let applied_paths = leaves(applied, scope);
    // Two managers naming one list item share it: only fields' values conflict.
    let clashes = |path: &FieldPath, owned: &FieldPath| {
        !is_item(path) && !is_item(owned) && overlaps(path, owned)
    };
    let subresource = scope.subresource();
    let mut conflicts = Vec::new();
    for entry in entries
        .iter_mut()
        .filter(|entry| entry.manager != manager && entry.subresource == subresource)
    {
        let taken: Vec<FieldPath> = applied_paths
            .iter()
            .filter(|path| {
                differs(&base, applied, path)
                    && entry.fields.iter().any(|owned| clashes(path, owned))
            })
            .cloned()
            .collect();
        for path in &taken {
            conflicts.push(Conflict {
                manager: entry.manager.clone(),
                path: path.clone(),
            });
        }
        if force {
            entry
                .fields
                .retain(|owned| !taken.iter().any(|path| takes(path, owned)));
        }
    }
    if !force && !conflicts.is_empty() {
        return Err(conflicts);
    }
    let mut merged = base.clone();
    let mut walk = Walk {
        custom: is_custom(applied),
        path: Vec::new(),
        fields: Vec::new(),
    };
    walk.merge(&mut merged, applied);
    let api_version = applied["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let previous = entry_mut(&mut entries, manager, "Apply", scope, &api_version)
        .fields
        .clone();
    // Fields this manager stopped applying go away unless someone else owns them too (a field
    // in an item another manager owns is not theirs), or the apply names what is below them (a
    // list once applied empty).
    for dropped in previous.difference(&applied_paths) {
        let shared = entries.iter().any(|entry| {
            !(entry.manager == manager && entry.operation == "Apply")
                && entry.fields.iter().any(|owned| takes(dropped, owned))
        });
        let still_applied = applied_paths.iter().any(|path| path.starts_with(dropped));
        if !shared && !still_applied {
            remove_with_empty_parents(&mut merged, dropped, applied);
        }
    }
    entry_mut(&mut entries, manager, "Apply", scope, &api_version).fields = applied_paths;
    write_entries(&mut merged, &entries);
    Ok(merged)
}

impl<'a> Walk<'a> {
    /// Deep merge of an apply configuration: objects merge, associative lists by key, sets by
    /// value; atomic lists and scalars replace.
    fn merge(&mut self, target: &mut Value, applied: &'a Value) {
        match (target, applied) {
            (Value::Object(target), Value::Object(applied)) => {
                for (key, value) in applied {
                    if key == "managedFields" || value.is_null() {
                        continue;
                    }
                    match target.get_mut(key) {
                        Some(existing) if existing.is_object() && value.is_object() => {
                            self.fields.push(key);
                            self.merge(existing, value);
                            self.fields.pop();
                        }
                        Some(existing) if existing.is_array() && value.is_array() => {
                            self.fields.push(key);
                            self.merge(existing, value);
                            self.fields.pop();
                        }
                        _ => {
                            target.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
            (Value::Array(target), Value::Array(applied)) => match self.list_type() {
                ListType::Atomic => *target = applied.clone(),
                ListType::Set => {
                    for item in applied {
                        if !target.contains(item) {
                            target.push(item.clone());
                        }
                    }
                }
                ListType::Map(_) => {
                    let list_type = self.list_type();
                    for item in applied {
                        let part = item_part(list_type, item);
                        let found = ItemRef::parse(&part)
                            .and_then(|key| target.iter_mut().find(|each| key.matches(each)));
                        match found {
                            Some(existing) => self.merge(existing, item),
                            None => target.push(item.clone()),
                        }
                    }
                }
            },
            (target, applied) => *target = applied.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_map_no_longer_applied_goes_with_its_fields() {
        let first = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"},
            "status": {"ready": 1, "rollout": {"partition": 2, "updated": 1}}});
        let applied = apply(None, &first, "op", false, Scope::Status).unwrap();
        let second = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "a"},
            "status": {"ready": 2}});
        let merged = apply(Some(&applied), &second, "op", false, Scope::Status).unwrap();
        assert_eq!(
            merged["status"],
            json!({"ready": 2}),
            "no empty rollout map left behind"
        );
    }

    #[test]
    fn fields_v1_round_trips() {
        let object = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "a", "labels": {"x": "1"}}, "data": {"k": "v", "l": "w"}});
        let fields = leaves(&object, Scope::Everything);
        assert_eq!(fields.len(), 3, "{fields:?}");
        assert_eq!(decode(&encode(&fields)), fields);
        assert_eq!(
            encode(&fields)["f:data"]["f:k"],
            json!({}),
            "FieldsV1 shape"
        );
    }

    fn statefulset(env: Value, ports: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "qb"},
            "spec": {"template": {"spec": {
                "containers": [{"name": "broker", "image": "quiver:1", "env": env, "ports": ports}],
                "volumes": [{"name": "config", "configMap": {"name": "qb-config"}}]}}}})
    }

    fn container(object: &Value) -> &Value {
        &object["spec"]["template"]["spec"]["containers"][0]
    }

    fn env_names(object: &Value) -> Vec<&str> {
        container(object)["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|var| var["name"].as_str())
            .collect()
    }

    #[test]
    fn another_managers_env_var_survives_an_apply_that_does_not_name_it() {
        let ports = json!([{"name": "remoting", "containerPort": 10911, "protocol": "TCP"}]);
        let operator = statefulset(
            json!([{"name": "POD_NAME", "value": "a"}, {"name": "OLD", "value": "x"}]),
            ports.clone(),
        );
        let stored = apply(None, &operator, "op", true, Scope::MainWithoutStatus).unwrap();
        // kubectl adds DEBUG to the broker container, naming only what it sets.
        let kubectl = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "qb"}, "spec": {"template": {"spec": {"containers": [
                {"name": "broker", "env": [{"name": "DEBUG", "value": "1"}]}]}}}});
        let edited = apply(
            Some(&stored),
            &kubectl,
            "kubectl",
            false,
            Scope::MainWithoutStatus,
        )
        .expect("a new list item is no conflict");
        assert_eq!(env_names(&edited), ["POD_NAME", "OLD", "DEBUG"]);
        assert_eq!(
            container(&edited)["image"],
            "quiver:1",
            "the container merged, not replaced"
        );

        // The operator applies again without OLD: OLD goes, DEBUG (kubectl's) stays.
        let again = statefulset(json!([{"name": "POD_NAME", "value": "a"}]), ports);
        let merged = apply(Some(&edited), &again, "op", true, Scope::MainWithoutStatus).unwrap();
        assert_eq!(env_names(&merged), ["POD_NAME", "DEBUG"]);
        assert_eq!(
            merged["spec"]["template"]["spec"]["volumes"][0]["name"],
            "config"
        );
        let fields = &merged["metadata"]["managedFields"];
        let kubectl_fields = fields
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["manager"] == "kubectl")
            .expect("kubectl still owns DEBUG");
        let env = &kubectl_fields["fieldsV1"]["f:spec"]["f:template"]["f:spec"]["f:containers"][r#"k:{"name":"broker"}"#]
            ["f:env"][r#"k:{"name":"DEBUG"}"#];
        assert_eq!(env["."], json!({}), "{kubectl_fields}");
        let paths = leaves(&merged, Scope::MainWithoutStatus);
        assert_eq!(
            decode(&encode(&paths)),
            paths,
            "list items round-trip FieldsV1"
        );
    }

    #[test]
    fn a_field_the_operator_owns_is_taken_back_and_a_value_clash_conflicts() {
        let operator = statefulset(json!([{"name": "POD_NAME", "value": "a"}]), json!([]));
        let stored = apply(None, &operator, "op", true, Scope::MainWithoutStatus).unwrap();
        let kubectl = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "qb"}, "spec": {"template": {"spec": {"containers": [
                {"name": "broker", "env": [{"name": "POD_NAME", "value": "b"}]}]}}}});
        let conflicts = apply(
            Some(&stored),
            &kubectl,
            "kubectl",
            false,
            Scope::MainWithoutStatus,
        )
        .expect_err("the operator owns POD_NAME's value");
        assert_eq!(
            dotted(&conflicts[0].path),
            r#".spec.template.spec.containers[name="broker"].env[name="POD_NAME"].value"#
        );
        let forced = apply(
            Some(&stored),
            &kubectl,
            "kubectl",
            true,
            Scope::MainWithoutStatus,
        )
        .unwrap();
        assert_eq!(container(&forced)["env"][0]["value"], "b");
        let back = apply(
            Some(&forced),
            &operator,
            "op",
            true,
            Scope::MainWithoutStatus,
        )
        .unwrap();
        assert_eq!(
            container(&back)["env"],
            json!([{"name": "POD_NAME", "value": "a"}])
        );
    }

    #[test]
    fn ports_merge_by_port_and_protocol_finalizers_as_a_set_owners_by_uid() {
        let port =
            |number: i64, protocol: &str| json!({"containerPort": number, "protocol": protocol});
        let first = statefulset(json!([]), json!([port(1, "TCP"), port(1, "UDP")]));
        let stored = apply(None, &first, "op", true, Scope::MainWithoutStatus).unwrap();
        let other = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "qb", "finalizers": ["b"],
                "ownerReferences": [{"uid": "u2", "name": "two"}]},
            "spec": {"template": {"spec": {"containers": [
                {"name": "broker", "ports": [{"containerPort": 1, "name": "one"}]}]}}}});
        let merged = apply(
            Some(&stored),
            &other,
            "other",
            true,
            Scope::MainWithoutStatus,
        )
        .unwrap();
        assert_eq!(
            container(&merged)["ports"],
            json!([{"containerPort": 1, "protocol": "TCP", "name": "one"}, port(1, "UDP")]),
            "a port without protocol is the TCP one"
        );
        let mine = json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": "qb", "finalizers": ["a"],
                "ownerReferences": [{"uid": "u1", "name": "one"}]}});
        let merged = apply(Some(&merged), &mine, "mine", true, Scope::MainWithoutStatus).unwrap();
        assert_eq!(merged["metadata"]["finalizers"], json!(["b", "a"]));
        let owners: Vec<&str> = merged["metadata"]["ownerReferences"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|owner| owner["uid"].as_str())
            .collect();
        assert_eq!(owners, ["u2", "u1"]);
    }

    #[test]
    fn lists_of_custom_resources_stay_atomic() {
        let broker = |topics: Value| {
            json!({"apiVersion": "quiver.io/v1alpha1", "kind": "Broker", "metadata": {"name": "qb"},
                "spec": {"topics": topics}})
        };
        let stored = apply(
            None,
            &broker(json!([{"name": "a"}])),
            "a",
            true,
            Scope::MainWithoutStatus,
        )
        .unwrap();
        let merged = apply(
            Some(&stored),
            &broker(json!([{"name": "b"}])),
            "b",
            true,
            Scope::MainWithoutStatus,
        )
        .unwrap();
        assert_eq!(merged["spec"]["topics"], json!([{"name": "b"}]));
    }
}
