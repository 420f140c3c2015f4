//! Test hooks: request log and counts, failure injection, direct reads and edits of objects
//! (through the same write pipeline as the API), events, storage classes.

use super::http::Route;
use super::ops::{self, ApiError, Ownership};
use super::resources::{self, ResourceType};
use super::store;
use super::TestApiServer;
use http::Method;
use kube::Resource;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

/// One request as the server saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// get, list, watch, create, update, patch, delete.
    pub verb: String,
    /// The API group, "" for the core group.
    pub group: String,
    /// The resource plural.
    pub resource: String,
    /// Namespace; empty for cluster-wide.
    pub namespace: String,
    /// Object name; empty for collections.
    pub name: String,
    /// "status" or empty.
    pub subresource: String,
    /// A patch (server-side apply) that created the object: authorized as create too.
    pub created: bool,
    /// When it came, in simulated ms since the epoch.
    pub at_ms: i64,
}

/// The next `remaining` requests with this method and path (no query) answer `code`, once
/// `skip` of them went through.
#[derive(Clone, Debug)]
pub struct FailureRule {
    pub method: Method,
    pub path: String,
    pub remaining: usize,
    pub code: u16,
    pub skip: usize,
}

/// Hook state kept by the server.
#[derive(Default)]
pub struct Hooks {
    pub requests: Vec<RequestRecord>,
    pub failures: Vec<FailureRule>,
}

impl Hooks {
    /// Logs a request (its index in the log, for [`Hooks::mark_created`]); the code to fail it
    /// with, if a failure rule matches.
    pub fn record(
        &mut self,
        verb: &str,
        route: &Route,
        method: &Method,
        path: &str,
    ) -> (usize, Option<u16>) {
        let index = self.requests.len();
        self.requests.push(RequestRecord {
            verb: verb.to_string(),
            group: route.rt.group.to_string(),
            resource: route.rt.plural.to_string(),
            namespace: route.namespace.clone().unwrap_or_default(),
            name: route.name.clone().unwrap_or_default(),
            subresource: route.subresource.clone().unwrap_or_default(),
            created: false,
            at_ms: super::sim_clock(),
        });
        let rule = self
            .failures
            .iter_mut()
            .find(|rule| rule.remaining > 0 && rule.method == method && rule.path == path);
        let code = rule.and_then(|rule| {
            if rule.skip > 0 {
                rule.skip -= 1;
                return None;
            }
            rule.remaining -= 1;
            Some(rule.code)
        });
        (index, code)
    }

    /// Notes that the request at `index` (a patch) created its object.
    pub fn mark_created(&mut self, index: usize) {
        if let Some(request) = self.requests.get_mut(index) {
            request.created = true;
        }
    }
}

/// The Status an injected failure answers with.
pub fn injected_error(code: u16) -> ApiError {
    let reason = match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    ApiError::new(code, reason, format!("injected failure ({code})"))
}

fn key_of<K: Resource<DynamicType = ()>>(namespace: &str, name: &str) -> store::ObjectKey {
    store::key(resources::of::<K>(), namespace, name)
}

impl TestApiServer {
    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared
            .hooks
            .lock()
            .expect("hooks lock poisoned")
            .requests
            .clone()
    }

    /// Requests so far with this verb, resource plural, name and subresource ("" for none).
    pub fn request_count(
        &self,
        verb: &str,
        resource: &str,
        name: &str,
        subresource: &str,
    ) -> usize {
        self.requests()
            .iter()
            .filter(|request| {
                request.verb == verb
                    && request.resource == resource
                    && request.name == name
                    && request.subresource == subresource
            })
            .count()
    }

    /// The next `times` requests with `method` on `path` (no query) answer `code`.
    pub fn fail_next(&self, method: Method, path: &str, times: usize, code: u16) {
        self.fail_after(method, path, 0, times, code);
    }

    /// Lets `skip` requests with `method` on `path` (no query) through, then the next `times`
    /// answer `code` (rules added earlier match first).
    pub fn fail_after(&self, method: Method, path: &str, skip: usize, times: usize, code: u16) {
        self.shared
            .hooks
            .lock()
            .expect("hooks lock poisoned")
            .failures
            .push(FailureRule {
                method,
                path: path.to_string(),
                remaining: times,
                code,
                skip,
            });
    }

    /// Watches of `K` deliver nothing more until [`TestApiServer::release_watches`]: a watch
    /// lagging behind the store (the changes are kept, in order). Requests are answered as usual.
    pub fn hold_watches<K: Resource<DynamicType = ()>>(&self) {
        let resource = resources::of::<K>().id();
        self.shared.held_watches.send_modify(|held| {
            held.insert(resource);
        });
    }

    /// Watches of `K` deliver what they held back, then keep up again.
    pub fn release_watches<K: Resource<DynamicType = ()>>(&self) {
        let resource = resources::of::<K>().id();
        self.shared.held_watches.send_modify(|held| {
            held.remove(&resource);
        });
    }

    /// The current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.shared.store().resource_version
    }

    /// Keeps only the last `limit` changes: watches from before them get 410 Expired.
    pub fn set_history_limit(&self, limit: usize) {
        let mut store = self.shared.store();
        store.history_limit = limit;
        while store.history.len() > limit {
            if let Some(dropped) = store.history.pop_front() {
                store.compacted = dropped.resource_version;
            }
        }
    }

    /// The stored object as JSON.
    pub fn raw<K: Resource<DynamicType = ()>>(&self, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .store()
            .get(&key_of::<K>(namespace, name))
            .cloned()
    }

    /// The stored object, typed.
    pub fn object<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<K> {
        self.raw::<K>(namespace, name)
            .map(|value| serde_json::from_value(value).expect("stored object deserializes"))
    }

    /// Every stored object of `K` in `namespace`.
    pub fn list<K: Resource<DynamicType = ()> + DeserializeOwned>(
        &self,
        namespace: &str,
    ) -> Vec<K> {
        let rt = resources::of::<K>();
        self.shared
            .store()
            .list(&rt.id(), Some(if rt.namespaced { namespace } else { "" }))
            .into_iter()
            .map(|value| serde_json::from_value(value).expect("stored object deserializes"))
            .collect()
    }

    /// (name, first container's image, Ready) of every pod in `namespace`.
    pub fn pod_states(&self, namespace: &str) -> Vec<(String, String, bool)> {
        self.list::<k8s_openapi::api::core::v1::Pod>(namespace)
            .into_iter()
            .map(|pod| {
                let image = pod.spec.as_ref().unwrap().containers[0]
                    .image
                    .clone()
                    .unwrap();
                let ready = pod
                    .status
                    .and_then(|status| status.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|condition| condition.type_ == "Ready" && condition.status == "True");
                (pod.metadata.name.unwrap(), image, ready)
            })
            .collect()
    }

    /// Creates `object` as a client would (admission included); its kind picks the resource.
    pub fn try_insert(&self, object: &impl Serialize) -> Result<Value, ApiError> {
        let value = serde_json::to_value(object).expect("object serializes");
        let api_version = value["apiVersion"].as_str().unwrap_or_default();
        let kind = value["kind"].as_str().unwrap_or_default();
        let rt = resources::by_kind(api_version, kind)
            .unwrap_or_else(|| panic!("{api_version} {kind} is not served"));
        let namespace = value["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default")
            .to_string();
        let mut store = self.shared.store();
        ops::commit_create(
            &mut store,
            rt,
            &namespace,
            value,
            Ownership::Update("test"),
            true,
        )
    }

    /// [`TestApiServer::try_insert`], panicking on rejection.
    pub fn insert(&self, object: &impl Serialize) -> Value {
        self.try_insert(object)
            .unwrap_or_else(|error| panic!("insert refused: {error:?}"))
    }

    /// Edits the stored object through the update pipeline (generation, admission, watchers).
    pub fn try_edit<K: Resource<DynamicType = ()>>(
        &self,
        namespace: &str,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> Result<Value, ApiError> {
        self.edit_scoped(resources::of::<K>(), namespace, name, None, edit)
    }

    /// [`TestApiServer::try_edit`], panicking on rejection.
    pub fn edit<K: Resource<DynamicType = ()>>(
        &self,
        namespace: &str,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> Value {
        self.try_edit::<K>(namespace, name, edit)
            .unwrap_or_else(|error| panic!("edit refused: {error:?}"))
    }

    /// Edits the status subresource of the stored object (only status changes are kept).
    pub fn edit_status<K: Resource<DynamicType = ()>>(
        &self,
        namespace: &str,
        name: &str,
        edit: impl FnOnce(&mut Value),
    ) -> Value {
        self.edit_scoped(resources::of::<K>(), namespace, name, Some("status"), edit)
            .unwrap_or_else(|error| panic!("status edit refused: {error:?}"))
    }

    fn edit_scoped(
        &self,
        rt: &'static ResourceType,
        namespace: &str,
        name: &str,
        subresource: Option<&str>,
        edit: impl FnOnce(&mut Value),
    ) -> Result<Value, ApiError> {
        let mut store = self.shared.store();
        let key = store::key(rt, namespace, name);
        let mut object = store
            .get(&key)
            .cloned()
            .ok_or_else(|| ApiError::not_found(rt, name))?;
        edit(&mut object);
        let scope = ops::scope_of(rt, subresource);
        ops::commit_update(
            &mut store,
            rt,
            &key,
            object,
            scope,
            Ownership::Update("test"),
            true,
        )
    }

    /// Deletes as a client would: finalizers honoured, dependents collected.
    pub fn delete<K: Resource<DynamicType = ()>>(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let mut store = self.shared.store();
        ops::delete(&mut store, resources::of::<K>(), namespace, name, false)
    }

    /// Events recorded so far (core v1 and events.k8s.io/v1), oldest first.
    pub fn events(&self) -> Vec<Value> {
        let store = self.shared.store();
        let mut events: Vec<Value> = resources::RESOURCES
            .iter()
            .filter(|rt| rt.kind == "Event")
            .flat_map(|rt| store.list(&rt.id(), None))
            .collect();
        events.sort_by_key(|event| {
            event["metadata"]["resourceVersion"]
                .as_str()
                .and_then(|rv| rv.parse::<u64>().ok())
        });
        events
    }

    /// Reasons of the events so far, oldest first.
    pub fn event_reasons(&self) -> Vec<String> {
        self.events()
            .iter()
            .filter_map(|event| event["reason"].as_str().map(str::to_string))
            .collect()
    }

    /// Adds a StorageClass; `default` marks it the cluster default (set on new PVCs).
    pub fn add_storage_class(&self, name: &str, allow_volume_expansion: bool, default: bool) {
        let mut class = json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": "test.quiver.io/disk",
            "allowVolumeExpansion": allow_volume_expansion,
        });
        if default {
            class["metadata"]["annotations"] =
                json!({"storageclass.kubernetes.io/is-default-class": "true"});
        }
        self.insert(&class);
    }
}
