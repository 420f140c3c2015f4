//! The scale subresource (`autoscaling/v1` Scale) of the custom resources whose CRD declares
//! one, served from the CRD's own `subresources.scale` paths as the API server serves it: GET
//! reads the spec's and the status' replicas and the selector; PUT and PATCH (merge, JSON) write
//! the spec's replicas through the update pipeline, so the resource's own validation (schema,
//! CEL), its generation, field ownership and watch events apply as to any write of it.

use super::ops::{self, ApiError, Ownership, PatchType};
use super::resources::ResourceType;
use super::store::{self, Store};
use crate::crd::{Broker, ConsumerGroup};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde_json::{json, Value};
use std::sync::OnceLock;

/// A CRD's scale paths, as JSON pointers into the resource.
#[derive(Debug)]
pub struct ScalePaths {
    spec_replicas: String,
    status_replicas: String,
    label_selector: Option<String>,
}

/// `.spec.replicas` as the JSON pointer `/spec/replicas` (scale paths have no array notation).
fn pointer(json_path: &str) -> String {
    json_path.replace('.', "/")
}

fn paths_of(crd: CustomResourceDefinition) -> Option<ScalePaths> {
    let version = crd.spec.versions.into_iter().next()?;
    let scale = version.subresources?.scale?;
    Some(ScalePaths {
        spec_replicas: pointer(&scale.spec_replicas_path),
        status_replicas: pointer(&scale.status_replicas_path),
        label_selector: scale.label_selector_path.as_deref().map(pointer),
    })
}

/// The scale paths of `rt`'s CRD; None when it declares no scale subresource.
pub fn paths(rt: &ResourceType) -> Option<&'static ScalePaths> {
    static BROKER: OnceLock<Option<ScalePaths>> = OnceLock::new();
    static GROUP: OnceLock<Option<ScalePaths>> = OnceLock::new();
    match rt.kind {
        "Broker" if rt.is_custom() => BROKER.get_or_init(|| paths_of(Broker::crd())).as_ref(),
        "ConsumerGroup" if rt.is_custom() => GROUP
            .get_or_init(|| paths_of(ConsumerGroup::crd()))
            .as_ref(),
        _ => None,
    }
}

fn no_scale(rt: &ResourceType) -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        format!("{} has no scale subresource", rt.plural),
    )
}

/// The Scale of `object`: its identity, spec.replicas, status.replicas (0 when the status has
/// none yet) and status.selector (absent when the status has none).
fn scale_of(object: &Value, paths: &ScalePaths) -> Result<Value, ApiError> {
    let metadata = &object["metadata"];
    let replicas = object.pointer(&paths.spec_replicas).ok_or_else(|| {
        ApiError::new(
            500,
            "InternalError",
            format!("the object has no value at {}", paths.spec_replicas),
        )
    })?;
    let mut scale = json!({
        "kind": "Scale", "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": metadata["name"], "namespace": metadata["namespace"], "uid": metadata["uid"],
            "resourceVersion": metadata["resourceVersion"],
            "creationTimestamp": metadata["creationTimestamp"],
        },
        "spec": {"replicas": replicas},
        "status": {"replicas": object.pointer(&paths.status_replicas).cloned().unwrap_or(json!(0))},
    });
    let selector = paths
        .label_selector
        .as_ref()
        .and_then(|path| object.pointer(path))
        .and_then(Value::as_str);
    if let Some(selector) = selector {
        scale["status"]["selector"] = selector.into();
    }
    Ok(scale)
}

/// GET of the Scale.
pub fn get(
    store: &Store,
    rt: &ResourceType,
    namespace: &str,
    name: &str,
) -> Result<Value, ApiError> {
    let paths = paths(rt).ok_or_else(|| no_scale(rt))?;
    scale_of(&ops::get(store, rt, namespace, name)?, paths)
}

/// 422 as the API server answers a Scale it refuses before the resource sees it.
fn invalid_scale(name: &str, value: &Value, detail: &str) -> ApiError {
    let message = format!("spec.replicas: Invalid value: {value}: {detail}");
    ApiError {
        details: json!({"name": name, "group": "autoscaling", "kind": "Scale",
                        "causes": [{"reason": "FieldValueInvalid", "message": message, "field": "spec.replicas"}]}),
        ..ApiError::new(
            422,
            "Invalid",
            format!("Scale.autoscaling \"{name}\" is invalid: {message}"),
        )
    }
}

/// PUT of a Scale: its spec.replicas (0 when absent, as a Go client sends it) becomes the
/// resource's, under the Scale's resourceVersion when it names one.
pub fn replace(
    store: &mut Store,
    rt: &'static ResourceType,
    namespace: &str,
    name: &str,
    scale: &Value,
    manager: &str,
) -> Result<Value, ApiError> {
    let paths = paths(rt).ok_or_else(|| no_scale(rt))?;
    let key = store::key(rt, namespace, name);
    let stored = ops::get(store, rt, namespace, name)?;
    let wanted_version = scale["metadata"]["resourceVersion"].as_str();
    if wanted_version.is_some_and(|version| {
        !version.is_empty() && Some(version) != stored["metadata"]["resourceVersion"].as_str()
    }) {
        return Err(ApiError::conflict(rt, name));
    }
    let replicas = scale["spec"].get("replicas").cloned().unwrap_or(json!(0));
    match replicas.as_i64() {
        Some(count) if count >= 0 && i32::try_from(count).is_ok() => {}
        Some(count) if count >= 0 => {
            return Err(invalid_scale(name, &replicas, "must fit in an int32"))
        }
        Some(_) => {
            return Err(invalid_scale(
                name,
                &replicas,
                "must be greater than or equal to 0",
            ))
        }
        None => {
            return Err(ApiError::bad_request(
                "Scale spec.replicas must be an integer",
            ))
        }
    }
    let mut updated = stored;
    let (parent, field) = paths
        .spec_replicas
        .rsplit_once('/')
        .expect("a pointer starts with /");
    match updated.pointer_mut(parent).and_then(Value::as_object_mut) {
        Some(parent) => parent.insert(field.to_string(), replicas),
        None => return Err(ApiError::bad_request("the resource has no spec")),
    };
    let scope = ops::scope_of(rt, None);
    let committed = ops::commit_update(
        store,
        rt,
        &key,
        updated,
        scope,
        Ownership::Update(manager),
        true,
    )?;
    scale_of(&committed, paths)
}

/// PATCH of the Scale (merge, or JSON patch; strategic merge as merge), then [`replace`].
/// Server-side apply to the Scale is refused: this server does not serve it.
pub fn patch(
    store: &mut Store,
    rt: &'static ResourceType,
    namespace: &str,
    name: &str,
    request: &ops::PatchRequest<'_>,
) -> Result<Value, ApiError> {
    if request.patch_type == PatchType::Apply {
        return Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "server-side apply to the scale subresource is not served by the test API server: \
             use a merge or JSON patch, or PUT the Scale",
        ));
    }
    let mut patched = get(store, rt, namespace, name)?;
    let parsed: Value = serde_json::from_slice(request.body)
        .map_err(|error| ApiError::bad_request(format!("the patch does not parse: {error}")))?;
    if request.patch_type == PatchType::Json {
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
        json_patch::merge(&mut patched, &parsed);
    }
    let manager = request.manager.unwrap_or(request.default_manager);
    replace(store, rt, namespace, name, &patched, manager)
}

#[cfg(test)]
mod tests {
    use crate::crd::Broker;
    use crate::fixtures::BrokerFixture;
    use crate::testapi::TestApiServer;
    use kube::api::{Api, Patch, PatchParams, PostParams};

    fn refusal(error: kube::Error) -> (u16, String) {
        match error {
            kube::Error::Api(status) => (status.code, status.message),
            other => panic!("not an API error: {other:?}"),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_scale_reads_and_writes_spec_replicas_under_the_brokers_own_rules() {
        let server = TestApiServer::start().await;
        let mut broker = Broker::test().replicas(3);
        broker.metadata.uid = None;
        let stored = server.insert(&broker);
        server.edit_status::<Broker>("ns", "qb", |broker| {
            broker["status"]["replicas"] = 3.into();
            broker["status"]["labelSelector"] = "app=quiver".into();
        });
        let api: Api<Broker> = Api::namespaced(server.client(), "ns");

        let scale = api.get_scale("qb").await.expect("the Broker has a scale");
        let spec = scale.spec.clone().expect("spec");
        let status = scale.status.clone().expect("status");
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(
            (status.replicas, status.selector.as_deref()),
            (3, Some("app=quiver"))
        );
        assert_eq!(
            scale.metadata.uid.as_deref(),
            stored["metadata"]["uid"].as_str()
        );

        // kubectl scale: a merge patch of the Scale; the generation counts it.
        let patch = serde_json::json!({"spec": {"replicas": 5}});
        let scaled = api
            .patch_scale("qb", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("scaled");
        assert_eq!(scaled.spec.and_then(|spec| spec.replicas), Some(5));
        let broker = api.get("qb").await.expect("stored");
        assert_eq!(
            (broker.spec.replicas, broker.metadata.generation),
            (5, Some(2))
        );

        // An HPA: PUT of the Scale it read; a stale one conflicts.
        let mut stale = scale.clone();
        stale.spec = Some(k8s_openapi::api::autoscaling::v1::ScaleSpec { replicas: Some(4) });
        let (code, _) = refusal(
            api.replace_scale("qb", &PostParams::default(), &stale)
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 409, "the Scale read before the patch is stale");

        // The Broker's own CEL rule (replicas >= 1) and the Scale's (>= 0) both apply.
        let zero = serde_json::json!({"spec": {"replicas": 0}});
        let (code, message) = refusal(
            api.patch_scale("qb", &PatchParams::default(), &Patch::Merge(&zero))
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 422);
        assert!(message.contains("replicas must be at least 1"), "{message}");
        let negative = serde_json::json!({"spec": {"replicas": -1}});
        let (code, message) = refusal(
            api.patch_scale("qb", &PatchParams::default(), &Patch::Merge(&negative))
                .await
                .unwrap_err(),
        );
        assert_eq!(code, 422);
        assert!(
            message.contains("must be greater than or equal to 0"),
            "{message}"
        );
        assert_eq!(api.get("qb").await.expect("stored").spec.replicas, 5);
    }
}
