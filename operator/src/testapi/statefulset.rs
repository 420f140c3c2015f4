//! A simulated StatefulSet controller, kubelet and volume resizer, one pass per `step`.
//!
//! The controller honours `podManagementPolicy`. OrderedReady: it creates the lowest missing
//! ordinal once every lower one is Running and Ready, one per pass, and halts at the first pod
//! that is not (so a pod that never becomes Ready blocks scale-up, scale-down and the rollout,
//! even after the template is fixed, until someone deletes it: the OrderedReady trap); it scales
//! down from the highest ordinal, one pod at a time, each once the one before is gone.
//! Parallel: it creates every missing pod and deletes every pod past the replicas at once,
//! whatever the other pods do. A failed pod is deleted and recreated. Updates: under
//! `RollingUpdate` it deletes outdated pods at or above the partition, as many at once as
//! `maxUnavailable` (default 1) allows counting every unavailable pod, lowest ordinal first (the
//! real controller goes highest first; a simulator that does not shows that a rollout's order
//! comes from the partition the operator sets, not from the simulator); under `OnDelete` it
//! only recreates what was deleted. Revisions are `<name>-<hash of the template>`; pods below
//! the partition are recreated from the template of the current revision. Pods matching the
//! selector that no controller owns (a StatefulSet deleted with orphan propagation) are
//! adopted. Claims come from volumeClaimTemplates and stay unless
//! `persistentVolumeClaimRetentionPolicy` says Delete.
//!
//! The kubelet: a new pod is Pending for a pass, then runs as its [`PodBehaviour`] says. A
//! deleted pod (a deletionTimestamp) is not Ready at once and is removed once its containers
//! have stopped ([`STOP_PASSES`] passes) or its grace period is over.

use super::fields::Scope;
use super::ops::{self, Ownership};
use super::resources::{self, ResourceType};
use super::store::{self, ObjectKey, Store};
use super::Shared;
use crate::quantity::quantity_bytes;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

/// What the kubelet makes of a pod's containers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodBehaviour {
    /// Running and Ready one pass after creation.
    Ready,
    /// Never Ready, its container restarting (CrashLoopBackOff): nothing runs in it.
    CrashLoop,
    /// Running but never Ready (its readiness probe fails): the process in it runs.
    Unready,
}

/// Kubelet passes a deleted pod's containers take to stop (a broker's SIGTERM handover and
/// flush), unless its grace period ends first.
pub const STOP_PASSES: u32 = 2;

/// What the simulation remembers between passes.
#[derive(Default)]
pub struct SimState {
    images: HashMap<String, PodBehaviour>,
    pods: HashMap<(String, String), PodBehaviour>,
    /// Pod templates by (namespace, StatefulSet, revision): pods below the partition are
    /// recreated at the current revision, as ControllerRevisions allow.
    templates: HashMap<(String, String, String), Value>,
    /// Claims (namespace, name) the volume resizer leaves alone: a stuck expansion.
    stalled_claims: std::collections::HashSet<(String, String)>,
    /// Kubelet passes each terminating pod (by uid) has been stopping for.
    stopping: HashMap<String, u32>,
}

fn rt(group: &str, plural: &str) -> &'static ResourceType {
    resources::by_path(group, "v1", plural).expect("served resource")
}

/// One pass: every StatefulSet, then the kubelet, then the volume resizer.
pub(crate) fn step(shared: &Shared) {
    let mut store = shared.store();
    let mut sim = shared.sim.lock().expect("sim lock poisoned");
    let statefulsets: Vec<ObjectKey> = store
        .objects
        .keys()
        .filter(|key| key.0 == rt("apps", "statefulsets").id())
        .cloned()
        .collect();
    for key in statefulsets {
        reconcile(&mut store, &mut sim, &key);
    }
    kubelet(&mut store, &mut sim);
    resize_claims(&mut store, &sim);
}

/// Hashes `value` with object keys in sorted order, whatever the map's order.
fn hash_canonical(value: &Value, hasher: &mut impl Hasher) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            for key in keys {
                key.hash(hasher);
                hash_canonical(&map[key], hasher);
            }
        }
        Value::Array(items) => {
            items.len().hash(hasher);
            items.iter().for_each(|item| hash_canonical(item, hasher));
        }
        other => other.to_string().hash(hasher),
    }
}

/// `<name>-<hash>` of a pod template, like a ControllerRevision name.
pub fn revision(name: &str, template: &Value) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    hash_canonical(template, &mut hasher);
    format!("{name}-{:08x}", hasher.finish() as u32)
}

fn is_terminating(pod: &Value) -> bool {
    !pod["metadata"]["deletionTimestamp"].is_null()
}

/// Running and Ready, and not being deleted: what an available pod is.
fn is_healthy(pod: &Value) -> bool {
    is_ready(pod) && !is_terminating(pod)
}

fn is_ready(pod: &Value) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|condition| condition["type"] == "Ready" && condition["status"] == "True")
}

fn pod_revision(pod: &Value) -> &str {
    pod["metadata"]["labels"]["controller-revision-hash"]
        .as_str()
        .unwrap_or_default()
}

/// The StatefulSet as the pass sees it.
struct Set {
    namespace: String,
    name: String,
    uid: String,
    spec: Value,
    replicas: i64,
    partition: i64,
    /// Pods that may be unavailable while a rolling update deletes outdated ones.
    max_unavailable: i64,
    /// OrderedReady (the default), else Parallel.
    ordered: bool,
    update_revision: String,
    current_revision: String,
}

/// `maxUnavailable` of a rolling update: a count or a percentage of the replicas (rounded
/// down, at least 1); 1 when absent.
fn max_unavailable(spec: &Value, replicas: i64) -> i64 {
    let value = &spec["updateStrategy"]["rollingUpdate"]["maxUnavailable"];
    let percent = value
        .as_str()
        .and_then(|text| text.strip_suffix('%'))
        .and_then(|number| number.parse::<i64>().ok());
    match (value.as_i64(), percent) {
        (Some(count), _) => count.max(1),
        (_, Some(percent)) => (replicas * percent / 100).max(1),
        _ => 1,
    }
}

fn read_set(sts: &Value) -> Set {
    let spec = sts["spec"].clone();
    let name = sts["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let update_revision = revision(&name, &spec["template"]);
    let current_revision = sts["status"]["currentRevision"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| update_revision.clone());
    Set {
        namespace: sts["metadata"]["namespace"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        uid: sts["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        replicas: spec["replicas"].as_i64().unwrap_or(1),
        partition: spec["updateStrategy"]["rollingUpdate"]["partition"]
            .as_i64()
            .unwrap_or(0),
        max_unavailable: max_unavailable(&spec, spec["replicas"].as_i64().unwrap_or(1)),
        ordered: spec["podManagementPolicy"] != "Parallel",
        name,
        spec,
        update_revision,
        current_revision,
    }
}

fn pods_of(store: &Store, set: &Set) -> BTreeMap<i64, Value> {
    let prefix = format!("{}-", set.name);
    store
        .list(&rt("", "pods").id(), Some(&set.namespace))
        .into_iter()
        .filter(|pod| {
            pod["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|owner| owner["uid"] == set.uid.as_str())
        })
        .filter_map(|pod| {
            let ordinal = pod["metadata"]["name"]
                .as_str()?
                .strip_prefix(&prefix)?
                .parse()
                .ok()?;
            Some((ordinal, pod))
        })
        .collect()
}

fn reconcile(store: &mut Store, sim: &mut SimState, key: &ObjectKey) {
    let Some(sts) = store.get(key).cloned() else {
        return;
    };
    if !sts["metadata"]["deletionTimestamp"].is_null() {
        return;
    }
    let set = read_set(&sts);
    sim.templates
        .entry((
            set.namespace.clone(),
            set.name.clone(),
            set.update_revision.clone(),
        ))
        .or_insert_with(|| set.spec["template"].clone());
    adopt_orphans(store, &set);
    let pods = pods_of(store, &set);
    sync_pods(store, sim, &set, &pods);
    write_status(store, key, &set);
}

/// Takes the pods of this set's names that match its selector and that no controller owns, as
/// the controller's ControllerRef adoption does (after a delete with orphan propagation).
fn adopt_orphans(store: &mut Store, set: &Set) {
    let pods_rt = rt("", "pods");
    let prefix = format!("{}-", set.name);
    let selector = set.spec["selector"]["matchLabels"].as_object().cloned();
    let orphans: Vec<(ObjectKey, Value)> = store
        .list(&pods_rt.id(), Some(&set.namespace))
        .into_iter()
        .filter(|pod| {
            let named = pod["metadata"]["name"]
                .as_str()
                .and_then(|name| name.strip_prefix(&prefix))
                .is_some_and(|ordinal| ordinal.parse::<i64>().is_ok());
            let selected = selector
                .iter()
                .flatten()
                .all(|(key, value)| pod["metadata"]["labels"][key.as_str()] == *value);
            let controlled = pod["metadata"]["ownerReferences"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|owner| owner["controller"] == true);
            named && selected && !controlled
        })
        .filter_map(|pod| {
            let name = pod["metadata"]["name"].as_str()?.to_string();
            Some((store::key(pods_rt, &set.namespace, &name), pod))
        })
        .collect();
    for (key, mut pod) in orphans {
        let mut owners = pod["metadata"]["ownerReferences"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        owners.push(owner_reference(set));
        pod["metadata"]["ownerReferences"] = Value::Array(owners);
        let _ = ops::commit_update(
            store,
            pods_rt,
            &key,
            pod,
            Scope::Everything,
            Ownership::System,
            false,
        );
    }
}

/// One pass of the controller: pods created or replaced, then the scale-down, then the update.
fn sync_pods(store: &mut Store, sim: &SimState, set: &Set, pods: &BTreeMap<i64, Value>) {
    if create_or_replace(store, sim, set, pods) || scale_down(store, set, pods) {
        return;
    }
    if set.spec["updateStrategy"]["type"] != "OnDelete" {
        roll(store, set, pods);
    }
}

/// Creates missing pods and replaces failed ones: under OrderedReady one at a time, in order,
/// halting at a pod that is not Running and Ready; under Parallel all at once. Whether it
/// changed or waits for something (the pass ends there).
fn create_or_replace(
    store: &mut Store,
    sim: &SimState,
    set: &Set,
    pods: &BTreeMap<i64, Value>,
) -> bool {
    let mut changed = false;
    for ordinal in 0..set.replicas {
        match pods.get(&ordinal) {
            None => {
                let revision = if ordinal >= set.partition {
                    &set.update_revision
                } else {
                    &set.current_revision
                };
                create_pod(store, sim, set, ordinal, revision);
                changed = true;
            }
            Some(pod) if pod["status"]["phase"] == "Failed" && !is_terminating(pod) => {
                delete_pod(store, pod);
                changed = true;
            }
            Some(pod) if set.ordered && !is_healthy(pod) => return true,
            Some(_) => {}
        }
        if changed && set.ordered {
            return true;
        }
    }
    changed
}

/// Deletes the pods past the replicas: under OrderedReady the highest, once none is
/// terminating; under Parallel all. Whether any is left past the replicas.
fn scale_down(store: &mut Store, set: &Set, pods: &BTreeMap<i64, Value>) -> bool {
    let past: Vec<&Value> = pods.range(set.replicas..).map(|(_, pod)| pod).collect();
    if past.is_empty() {
        return false;
    }
    if set.ordered && pods.values().any(is_terminating) {
        return true;
    }
    let doomed: Vec<&Value> = if set.ordered {
        past.last().copied().into_iter().collect()
    } else {
        past.into_iter()
            .filter(|pod| !is_terminating(pod))
            .collect()
    };
    for pod in doomed {
        delete_pod(store, pod);
        let ordinal = pod_ordinal(set, pod);
        if set.spec["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Delete" {
            delete_claims(store, set, ordinal);
        }
    }
    true
}

fn pod_ordinal(set: &Set, pod: &Value) -> i64 {
    pod["metadata"]["name"]
        .as_str()
        .and_then(|name| name.strip_prefix(&format!("{}-", set.name)))
        .and_then(|ordinal| ordinal.parse().ok())
        .unwrap_or_default()
}

/// A rolling update: outdated pods at or above the partition are deleted (and recreated at the
/// update revision by a later pass) while fewer than `maxUnavailable` pods are unavailable,
/// lowest ordinal first.
fn roll(store: &mut Store, set: &Set, pods: &BTreeMap<i64, Value>) {
    let unavailable = (0..set.replicas)
        .filter(|ordinal| pods.get(ordinal).is_none_or(|pod| !is_healthy(pod)))
        .count();
    let allowed = usize::try_from(set.max_unavailable)
        .unwrap_or(1)
        .saturating_sub(unavailable);
    let outdated = (set.partition.max(0)..set.replicas)
        .filter_map(|ordinal| pods.get(&ordinal))
        .filter(|pod| pod_revision(pod) != set.update_revision && !is_terminating(pod));
    for pod in outdated.take(allowed) {
        delete_pod(store, pod);
    }
}

fn delete_pod(store: &mut Store, pod: &Value) {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    let namespace = pod["metadata"]["namespace"].as_str().unwrap_or_default();
    let _ = ops::delete(store, rt("", "pods"), namespace, name, false);
}

fn claim_names(set: &Set, ordinal: i64) -> Vec<(String, Value)> {
    set.spec["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|claim| {
            let template = claim["metadata"]["name"].as_str().unwrap_or("data");
            (format!("{template}-{}-{ordinal}", set.name), claim.clone())
        })
        .collect()
}

fn delete_claims(store: &mut Store, set: &Set, ordinal: i64) {
    for (name, _) in claim_names(set, ordinal) {
        let _ = ops::delete(
            store,
            rt("", "persistentvolumeclaims"),
            &set.namespace,
            &name,
            false,
        );
    }
}

fn owner_reference(set: &Set) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "name": set.name, "uid": set.uid,
           "controller": true, "blockOwnerDeletion": true})
}

fn create_pod(store: &mut Store, sim: &SimState, set: &Set, ordinal: i64, revision: &str) {
    let template = sim
        .templates
        .get(&(
            set.namespace.clone(),
            set.name.clone(),
            revision.to_string(),
        ))
        .cloned()
        .unwrap_or_else(|| set.spec["template"].clone());
    let name = format!("{}-{ordinal}", set.name);
    let mut labels = template["metadata"]["labels"].clone();
    if !labels.is_object() {
        labels = json!({});
    }
    labels["controller-revision-hash"] = revision.into();
    labels["statefulset.kubernetes.io/pod-name"] = name.clone().into();
    labels["apps.kubernetes.io/pod-index"] = ordinal.to_string().into();
    let mut spec = template["spec"].clone();
    spec["hostname"] = name.clone().into();
    spec["subdomain"] = set.spec["serviceName"].clone();
    for (claim, template) in claim_names(set, ordinal) {
        let volume = template["metadata"]["name"].clone();
        let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
        let mut volumes: Vec<Value> = volumes
            .into_iter()
            .filter(|v| v["name"] != volume)
            .collect();
        volumes.push(json!({"name": volume, "persistentVolumeClaim": {"claimName": claim}}));
        spec["volumes"] = Value::Array(volumes);
        create_claim(store, set, &claim, &template);
    }
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": set.namespace, "labels": labels,
                     "annotations": template["metadata"]["annotations"].clone(),
                     "ownerReferences": [owner_reference(set)]},
        "spec": spec,
    });
    let _ = ops::commit_create(
        store,
        rt("", "pods"),
        &set.namespace,
        pod,
        Ownership::System,
        false,
    );
}

fn create_claim(store: &mut Store, set: &Set, name: &str, template: &Value) {
    let pvcs = rt("", "persistentvolumeclaims");
    if store.get(&store::key(pvcs, &set.namespace, name)).is_some() {
        return;
    }
    let mut claim = json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": set.namespace,
                     "labels": set.spec["selector"]["matchLabels"].clone()},
        "spec": template["spec"].clone(),
    });
    if set.spec["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete" {
        claim["metadata"]["ownerReferences"] = json!([owner_reference(set)]);
    }
    if ops::commit_create(store, pvcs, &set.namespace, claim, Ownership::System, true).is_err() {
        return;
    }
    let key = store::key(pvcs, &set.namespace, name);
    let mut bound = store.get(&key).cloned().unwrap_or_default();
    let size = bound["spec"]["resources"]["requests"]["storage"].clone();
    bound["status"] = json!({"phase": "Bound", "accessModes": bound["spec"]["accessModes"].clone(),
                             "capacity": {"storage": size}});
    let _ = ops::commit_update(
        store,
        pvcs,
        &key,
        bound,
        Scope::Status,
        Ownership::System,
        false,
    );
}

fn write_status(store: &mut Store, key: &ObjectKey, set: &Set) {
    let pods = pods_of(store, set);
    let count =
        |predicate: &dyn Fn(&Value) -> bool| pods.values().filter(|pod| predicate(pod)).count();
    let ready = count(&is_healthy);
    let updated = count(&|pod| pod_revision(pod) == set.update_revision);
    let all_updated = updated == pods.len() && pods.len() as i64 == set.replicas;
    let current_revision = if all_updated {
        set.update_revision.clone()
    } else {
        set.current_revision.clone()
    };
    let current = count(&|pod| pod_revision(pod) == current_revision);
    let Some(sts) = store.get(key) else {
        return;
    };
    let status = json!({
        "observedGeneration": sts["metadata"]["generation"].clone(),
        "replicas": pods.len(),
        "readyReplicas": ready,
        "availableReplicas": ready,
        "currentReplicas": current,
        "updatedReplicas": updated,
        "currentRevision": current_revision,
        "updateRevision": set.update_revision,
        "collisionCount": 0,
    });
    if sts["status"] == status {
        return;
    }
    let mut sts = sts.clone();
    sts["status"] = status;
    let statefulsets = rt("apps", "statefulsets");
    let _ = ops::commit_update(
        store,
        statefulsets,
        key,
        sts,
        Scope::Status,
        Ownership::System,
        false,
    );
}

fn behaviour(sim: &SimState, pod: &Value) -> PodBehaviour {
    let namespace = pod["metadata"]["namespace"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = pod["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if let Some(behaviour) = sim.pods.get(&(namespace, name)) {
        return *behaviour;
    }
    let crashing = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|container| container["image"].as_str())
        .any(|image| sim.images.get(image) == Some(&PodBehaviour::CrashLoop));
    if crashing {
        PodBehaviour::CrashLoop
    } else {
        PodBehaviour::Ready
    }
}

/// The kubelet: a new pod is Pending for one pass, then runs as its behaviour says; a deleted
/// one stops (not Ready) and is removed once stopped or past its grace period.
fn kubelet(store: &mut Store, sim: &mut SimState) {
    let pods_rt = rt("", "pods");
    let pods: Vec<(ObjectKey, Value)> = store
        .objects
        .iter()
        .filter(|(key, _)| key.0 == pods_rt.id())
        .map(|(key, pod)| (key.clone(), pod.clone()))
        .collect();
    for (key, mut pod) in pods {
        let status = if is_terminating(&pod) {
            let uid = pod["metadata"]["uid"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let passes = sim.stopping.entry(uid.clone()).or_default();
            *passes += 1;
            if *passes > STOP_PASSES || grace_over(&pod) {
                sim.stopping.remove(&uid);
                ops::remove_object(store, &key, false);
                continue;
            }
            stopping_status(&pod)
        } else if pod["status"]["phase"].is_null() {
            json!({"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]})
        } else {
            running_status(&pod, behaviour(sim, &pod))
        };
        if pod["status"] == status {
            continue;
        }
        pod["status"] = status;
        let _ = ops::commit_update(
            store,
            pods_rt,
            &key,
            pod,
            Scope::Status,
            Ownership::System,
            false,
        );
    }
}

/// Whether a terminating pod's deadline (its deletionTimestamp) has passed in simulated time.
fn grace_over(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"]
        .as_str()
        .and_then(|deadline| deadline.parse::<k8s_openapi::jiff::Timestamp>().ok())
        .is_some_and(|deadline| super::sim_clock() >= deadline.as_millisecond())
}

/// A pod whose containers were told to stop: still Running, no longer Ready.
fn stopping_status(pod: &Value) -> Value {
    let mut status = pod["status"].clone();
    status["conditions"] = json!([
        {"type": "PodScheduled", "status": "True"},
        {"type": "ContainersReady", "status": "False"},
        {"type": "Ready", "status": "False"},
    ]);
    if let Some(containers) = status["containerStatuses"].as_array_mut() {
        for container in containers {
            container["ready"] = false.into();
        }
    }
    status
}

fn running_status(pod: &Value, behaviour: PodBehaviour) -> Value {
    let ready = behaviour == PodBehaviour::Ready;
    let running = behaviour != PodBehaviour::CrashLoop;
    let flag = if ready { "True" } else { "False" };
    let containers: Vec<Value> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|container| {
            let state = if running {
                json!({"running": {}})
            } else {
                json!({"waiting": {"reason": "CrashLoopBackOff"}})
            };
            json!({"name": container["name"], "image": container["image"], "ready": ready,
                   "started": running, "restartCount": if running { 0 } else { 1 },
                   "state": state})
        })
        .collect();
    json!({
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "ContainersReady", "status": flag},
            {"type": "Ready", "status": flag},
        ],
        "containerStatuses": containers,
    })
}

/// The process of pod `namespace/name`, if one runs: the pod exists, is not being deleted and
/// its first container is running. (The pod's uid, whether it is Ready.)
pub(crate) fn running_process(
    shared: &Shared,
    namespace: &str,
    name: &str,
) -> Option<(String, bool)> {
    let store = shared.store();
    let pod = store.get(&store::key(rt("", "pods"), namespace, name))?;
    let running = !pod["status"]["containerStatuses"][0]["state"]["running"].is_null();
    if is_terminating(pod) || !running {
        return None;
    }
    let uid = pod["metadata"]["uid"].as_str()?.to_string();
    Some((uid, is_ready(pod)))
}

/// The external resizer and kubelet: a grown request first shows FileSystemResizePending, then
/// the capacity follows; a stalled claim keeps its capacity.
fn resize_claims(store: &mut Store, sim: &SimState) {
    let pvcs = rt("", "persistentvolumeclaims");
    let claims: Vec<(ObjectKey, Value)> = store
        .objects
        .iter()
        .filter(|(key, _)| key.0 == pvcs.id())
        .map(|(key, claim)| (key.clone(), claim.clone()))
        .collect();
    for (key, mut claim) in claims {
        let requested = claim["spec"]["resources"]["requests"]["storage"].clone();
        let bytes = |value: &Value| value.as_str().and_then(quantity_bytes).unwrap_or(0);
        if bytes(&requested) <= bytes(&claim["status"]["capacity"]["storage"])
            || sim.stalled_claims.contains(&(key.1.clone(), key.2.clone()))
        {
            continue;
        }
        let pending = claim["status"]["conditions"]
            .as_array()
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| c["type"] == "FileSystemResizePending")
            });
        if pending {
            claim["status"]["capacity"]["storage"] = requested;
            claim["status"]["conditions"] = json!([]);
        } else {
            claim["status"]["allocatedResources"] = json!({"storage": requested});
            claim["status"]["conditions"] =
                json!([{"type": "FileSystemResizePending", "status": "True"}]);
        }
        let _ = ops::commit_update(
            store,
            pvcs,
            &key,
            claim,
            Scope::Status,
            Ownership::System,
            false,
        );
    }
}

impl super::TestApiServer {
    /// Pods running `image` from now on behave like this (default Ready).
    pub fn set_image_behaviour(&self, image: &str, behaviour: PodBehaviour) {
        let mut sim = self.shared.sim.lock().expect("sim lock poisoned");
        sim.images.insert(image.to_string(), behaviour);
    }

    /// Pod `namespace/name` behaves like this, whatever its image (until deleted and recreated
    /// it keeps the override: the override is by name).
    pub fn set_pod_behaviour(&self, namespace: &str, name: &str, behaviour: PodBehaviour) {
        let mut sim = self.shared.sim.lock().expect("sim lock poisoned");
        sim.pods
            .insert((namespace.to_string(), name.to_string()), behaviour);
    }

    /// The volume resizer stops resizing claim `namespace/name` (a driver that fails) until
    /// [`super::TestApiServer::resume_resize`].
    pub fn stall_resize(&self, namespace: &str, name: &str) {
        let mut sim = self.shared.sim.lock().expect("sim lock poisoned");
        sim.stalled_claims
            .insert((namespace.to_string(), name.to_string()));
    }

    /// The volume resizer resizes claim `namespace/name` again.
    pub fn resume_resize(&self, namespace: &str, name: &str) {
        let mut sim = self.shared.sim.lock().expect("sim lock poisoned");
        sim.stalled_claims
            .remove(&(namespace.to_string(), name.to_string()));
    }

    /// Drops a per-pod override set by [`super::TestApiServer::set_pod_behaviour`].
    pub fn clear_pod_behaviour(&self, namespace: &str, name: &str) {
        let mut sim = self.shared.sim.lock().expect("sim lock poisoned");
        sim.pods.remove(&(namespace.to_string(), name.to_string()));
    }
}
