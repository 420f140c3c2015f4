//! Field ownership (metadata.managedFields) and server-side apply.
//!
//! Ownership is per leaf path (objects are walked, lists and scalars are leaves: every list is
//! atomic, a simplification of associative lists). Each manager entry is keyed by (manager,
//! operation, subresource) and serialized as FieldsV1 (`{"f:spec": {"f:replicas": {}}}`).

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

/// `.spec.replicas`, as conflict messages print paths.
pub fn dotted(path: &[String]) -> String {
    path.iter().map(|part| format!(".{part}")).collect()
}

fn overlaps(a: &[String], b: &[String]) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The value at `path`, if present.
pub fn get<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |value, part| value.get(part))
}

fn remove(value: &mut Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let parent = parents
        .iter()
        .try_fold(value, |value, part| value.get_mut(part));
    if let Some(Value::Object(map)) = parent {
        map.remove(last);
    }
}

/// Removes `path`, then the maps it leaves empty (below the top level) that `applied` does not
/// name: the manager owned those maps too, as FieldsV1 `"."` entries record.
fn remove_with_empty_parents(value: &mut Value, path: &[String], applied: &Value) {
    remove(value, path);
    for depth in (2..path.len()).rev() {
        let parent = &path[..depth];
        let empty =
            get(value, parent).is_some_and(|node| node.as_object().is_some_and(Map::is_empty));
        if !empty || get(applied, parent).is_some() {
            break;
        }
        remove(value, parent);
    }
}

/// Leaf paths of `value` tracked in `scope`.
pub fn leaves(value: &Value, scope: Scope) -> BTreeSet<FieldPath> {
    fn walk(value: &Value, prefix: &mut FieldPath, out: &mut BTreeSet<FieldPath>) {
        match value {
            Value::Object(map) if !map.is_empty() => {
                for (key, child) in map {
                    prefix.push(key.clone());
                    walk(child, prefix, out);
                    prefix.pop();
                }
            }
            _ => {
                out.insert(prefix.clone());
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(value, &mut Vec::new(), &mut out);
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
            node = node
                .as_object_mut()
                .expect("FieldsV1 nodes are objects")
                .entry(format!("f:{part}"))
                .or_insert_with(|| Value::Object(Map::new()));
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
            if let Some(field) = key.strip_prefix("f:") {
                prefix.push(field.to_string());
                walk(child, prefix, out);
                prefix.pop();
            }
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
        .filter(|path| get(old, path) != get(new, path))
        .collect();
    if changed.is_empty() {
        write_entries(new, &entries);
        return;
    }
    for entry in entries.iter_mut() {
        entry
            .fields
            .retain(|owned| !changed.iter().any(|path| overlaps(path, owned)));
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
    let differs = |path: &FieldPath| get(&base, path) != get(applied, path);
    let subresource = scope.subresource();
    let mut conflicts = Vec::new();
    for entry in entries
        .iter_mut()
        .filter(|entry| entry.manager != manager && entry.subresource == subresource)
    {
        let taken: Vec<FieldPath> = applied_paths
            .iter()
            .filter(|path| differs(path) && entry.fields.iter().any(|owned| overlaps(path, owned)))
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
                .retain(|owned| !taken.iter().any(|path| overlaps(path, owned)));
        }
    }
    if !force && !conflicts.is_empty() {
        return Err(conflicts);
    }
    let mut merged = base.clone();
    merge_applied(&mut merged, applied);
    let api_version = applied["apiVersion"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let previous = entry_mut(&mut entries, manager, "Apply", scope, &api_version)
        .fields
        .clone();
    // Fields this manager stopped applying go away unless someone else owns them too.
    for dropped in previous.difference(&applied_paths) {
        let shared = entries.iter().any(|entry| {
            !(entry.manager == manager && entry.operation == "Apply")
                && entry.fields.iter().any(|owned| overlaps(owned, dropped))
        });
        if !shared {
            remove_with_empty_parents(&mut merged, dropped, applied);
        }
    }
    entry_mut(&mut entries, manager, "Apply", scope, &api_version).fields = applied_paths;
    write_entries(&mut merged, &entries);
    Ok(merged)
}

/// Deep merge of an apply configuration: objects merge, lists and scalars replace.
fn merge_applied(target: &mut Value, applied: &Value) {
    match (target, applied) {
        (Value::Object(target), Value::Object(applied)) => {
            for (key, value) in applied {
                if key == "managedFields" || value.is_null() {
                    continue;
                }
                match target.get_mut(key) {
                    Some(existing) if existing.is_object() && value.is_object() => {
                        merge_applied(existing, value)
                    }
                    _ => {
                        target.insert(key.clone(), value.clone());
                    }
                }
            }
        }
        (target, applied) => *target = applied.clone(),
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
}
