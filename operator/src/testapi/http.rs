//! HTTP semantics in-process: routes `/api/v1/...` and `/apis/{group}/{version}/...` to the
//! operations, answers errors as `metav1.Status`. [`handle`] serves one `http::Request` as a
//! connection's handler would, called by the clients' in-process transport
//! ([`super::TestApiServer::client`]): no socket.

use super::ops::{self, ApiError, PatchRequest, PatchType};
use super::resources::{self, ResourceType};
use super::scale;
use super::selector::Selector;
use super::watch::{self, WatchRequest};
use super::Shared;
use bytes::Bytes;
use futures::StreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use serde_json::Value;
use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

/// A response body: a whole JSON document, or a watch's stream of events.
pub(crate) type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Default `timeoutSeconds` of a watch, as kube-rs sends it.
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(290);

/// Where a request points.
#[derive(Debug)]
pub struct Route {
    pub rt: &'static ResourceType,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

fn not_found_path() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

/// Parses `/api/v1/namespaces/ns/pods/name/status` and friends.
pub fn route(path: &str) -> Result<Route, ApiError> {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_found_path()),
    };
    let (namespace, rest) = match rest {
        ["namespaces", namespace, rest @ ..] if !rest.is_empty() => {
            (Some(namespace.to_string()), rest)
        }
        rest => (None, rest),
    };
    let Some((plural, rest)) = rest.split_first() else {
        return Err(not_found_path());
    };
    let rt = resources::by_path(group, version, plural).ok_or_else(not_found_path)?;
    Ok(Route {
        rt,
        namespace,
        name: rest.first().map(|name| name.to_string()),
        subresource: rest.get(1).map(|sub| sub.to_string()),
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = bytes
            .get(index + 1..index + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[index], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                index += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                index += 1;
            }
            (byte, _) => {
                out.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query string as a map (last value wins).
pub fn parse_query(query: Option<&str>) -> HashMap<String, String> {
    query
        .unwrap_or_default()
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key), percent_decode(value))
        })
        .collect()
}

/// The Kubernetes verb of a request.
pub fn verb(method: &Method, route: &Route, query: &HashMap<String, String>) -> &'static str {
    let watching = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    match (method.as_str(), route.name.is_some()) {
        ("GET", true) => "get",
        ("GET", false) if watching => "watch",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        _ => "unknown",
    }
}

fn full(bytes: Vec<u8>) -> Body {
    Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed_unsync()
}

fn json_response(code: u16, value: &Value) -> Response<Body> {
    let body = serde_json::to_vec(value).expect("JSON serializes");
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::OK))
        .header("content-type", "application/json")
        .body(full(body))
        .expect("response builds")
}

fn error_response(error: &ApiError) -> Response<Body> {
    json_response(error.code, &error.status())
}

/// Serves one request: reads its body in full, then answers (a watch answers with a stream).
pub(crate) async fn handle<B>(shared: Arc<Shared>, request: Request<B>) -> Response<Body>
where
    B: hyper::body::Body<Data = Bytes>,
{
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|collected| collected.to_bytes())
        .unwrap_or_default();
    let query = parse_query(parts.uri.query());
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .unwrap_or_default()
            .to_string()
    };
    let context = RequestContext {
        method: parts.method.clone(),
        path: parts.uri.path().to_string(),
        query,
        content_type: header("content-type"),
        user_agent: header("user-agent"),
        body,
    };
    respond(&shared, context).unwrap_or_else(|error| error_response(&error))
}

/// One request, read in full.
struct RequestContext {
    method: Method,
    path: String,
    query: HashMap<String, String>,
    content_type: String,
    user_agent: String,
    body: Bytes,
}

impl RequestContext {
    fn body_json(&self) -> Result<Value, ApiError> {
        serde_json::from_slice(&self.body)
            .map_err(|error| ApiError::bad_request(format!("the body does not parse: {error}")))
    }

    /// The manager of an Update: `fieldManager`, else the user agent's program name.
    fn update_manager(&self) -> String {
        self.query.get("fieldManager").cloned().unwrap_or_else(|| {
            let program = self.user_agent.split('/').next().unwrap_or_default();
            if program.is_empty() {
                "unknown".to_string()
            } else {
                program.to_string()
            }
        })
    }
}

fn respond(shared: &Arc<Shared>, request: RequestContext) -> Result<Response<Body>, ApiError> {
    let route = route(&request.path)?;
    let verb = verb(&request.method, &route, &request.query);
    let (index, injected) = shared.hooks.lock().expect("hooks lock poisoned").record(
        verb,
        &route,
        &request.method,
        &request.path,
    );
    if let Some(code) = injected {
        return Err(super::hooks::injected_error(code));
    }
    let namespace = route.namespace.clone().unwrap_or_default();
    if route.rt.namespaced && route.name.is_some() && route.namespace.is_none() {
        return Err(not_found_path());
    }
    match verb {
        "watch" => watch_response(shared, &route, &request),
        "list" => {
            let (labels, fields) = selectors(&request.query)?;
            let store = shared.store();
            let namespace = route.namespace.as_deref();
            Ok(json_response(
                200,
                &ops::list(&store, route.rt, namespace, &labels, &fields),
            ))
        }
        _ => {
            let response = write_or_get(shared, &route, verb, &namespace, &request)?;
            if verb == "patch" && response.status() == 201 {
                let mut hooks = shared.hooks.lock().expect("hooks lock poisoned");
                hooks.mark_created(index);
            }
            Ok(response)
        }
    }
}

fn write_or_get(
    shared: &Arc<Shared>,
    route: &Route,
    verb: &str,
    namespace: &str,
    request: &RequestContext,
) -> Result<Response<Body>, ApiError> {
    let name = route.name.as_deref().unwrap_or_default();
    let subresource = route.subresource.as_deref();
    if subresource == Some("scale") {
        return scale_response(shared, route, verb, namespace, request);
    }
    if subresource.is_some_and(|sub| sub != "status") {
        return Err(not_found_path());
    }
    let mut store = shared.store();
    let manager = request.update_manager();
    match verb {
        "get" => Ok(json_response(
            200,
            &ops::get(&store, route.rt, namespace, name)?,
        )),
        "create" => {
            let body = request.body_json()?;
            let ownership = ops::Ownership::Update(&manager);
            let created =
                ops::commit_create(&mut store, route.rt, namespace, body, ownership, true)?;
            Ok(json_response(201, &created))
        }
        "update" => {
            let body = request.body_json()?;
            let replaced = ops::replace(
                &mut store,
                route.rt,
                namespace,
                name,
                subresource,
                body,
                &manager,
            )?;
            Ok(json_response(200, &replaced))
        }
        "patch" => {
            let patch = patch_request(request, &manager)?;
            let (patched, created) =
                ops::patch(&mut store, route.rt, namespace, name, subresource, &patch)?;
            Ok(json_response(if created { 201 } else { 200 }, &patched))
        }
        "delete" => {
            let orphan = orphan_requested(request);
            Ok(json_response(
                200,
                &ops::delete(&mut store, route.rt, namespace, name, orphan)?,
            ))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            format!("{verb} is not supported"),
        )),
    }
}

/// A PATCH's type, body and manager; 415 for a content type no patch has.
fn patch_request<'a>(
    request: &'a RequestContext,
    manager: &'a str,
) -> Result<PatchRequest<'a>, ApiError> {
    let patch_type = PatchType::from_content_type(&request.content_type).ok_or_else(|| {
        ApiError::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml; got {}", request.content_type))
    })?;
    Ok(PatchRequest {
        patch_type,
        body: &request.body,
        manager: request.query.get("fieldManager").map(String::as_str),
        default_manager: manager,
        force: request
            .query
            .get("force")
            .is_some_and(|force| force == "true"),
    })
}

/// The scale subresource of a resource whose CRD declares one: GET, PUT and PATCH of its
/// autoscaling/v1 Scale ([`scale`]).
fn scale_response(
    shared: &Arc<Shared>,
    route: &Route,
    verb: &str,
    namespace: &str,
    request: &RequestContext,
) -> Result<Response<Body>, ApiError> {
    if scale::paths(route.rt).is_none() {
        return Err(not_found_path());
    }
    let name = route.name.as_deref().unwrap_or_default();
    let mut store = shared.store();
    let manager = request.update_manager();
    let answer = match verb {
        "get" => scale::get(&store, route.rt, namespace, name)?,
        "update" => {
            let body = request.body_json()?;
            scale::replace(&mut store, route.rt, namespace, name, &body, &manager)?
        }
        "patch" => {
            let patch = patch_request(request, &manager)?;
            scale::patch(&mut store, route.rt, namespace, name, &patch)?
        }
        _ => {
            return Err(ApiError::new(
                405,
                "MethodNotAllowed",
                format!("{verb} is not supported on the scale subresource"),
            ))
        }
    };
    Ok(json_response(200, &answer))
}

fn orphan_requested(request: &RequestContext) -> bool {
    let from_body = serde_json::from_slice::<Value>(&request.body)
        .ok()
        .and_then(|body| body["propagationPolicy"].as_str().map(str::to_string));
    let policy = from_body.or_else(|| request.query.get("propagationPolicy").cloned());
    policy.as_deref() == Some("Orphan")
}

fn selectors(query: &HashMap<String, String>) -> Result<(Selector, Selector), ApiError> {
    let parse = |key: &str| {
        Selector::parse(query.get(key).map(String::as_str).unwrap_or_default())
            .map_err(ApiError::bad_request)
    };
    Ok((parse("labelSelector")?, parse("fieldSelector")?))
}

fn watch_response(
    shared: &Arc<Shared>,
    route: &Route,
    request: &RequestContext,
) -> Result<Response<Body>, ApiError> {
    let (labels, fields) = selectors(&request.query)?;
    let timeout = request
        .query
        .get("timeoutSeconds")
        .and_then(|seconds| seconds.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(DEFAULT_WATCH_TIMEOUT);
    let watch_request = WatchRequest {
        rt: route.rt,
        namespace: route.namespace.clone(),
        labels,
        fields,
        resource_version: request.query.get("resourceVersion").cloned(),
        timeout,
        bookmarks: request
            .query
            .get("allowWatchBookmarks")
            .is_some_and(|allow| allow == "true"),
    };
    let events = watch::open(shared, watch_request)?;
    let body = StreamBody::new(events.map(|bytes| Ok::<_, Infallible>(Frame::data(bytes))));
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed_unsync(body))
        .expect("response builds"))
}
