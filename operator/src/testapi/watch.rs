//! Watch streams: replay from a resourceVersion (410 Expired when older than the history),
//! live events in commit order, BOOKMARK events, and the stream closing at `timeoutSeconds`.

use super::ops::ApiError;
use super::resources::ResourceType;
use super::selector::Selector;
use super::store::{WatchFrame, Watcher};
use super::Shared;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// How often a watch that asked for bookmarks gets one (the API server's is about a minute).
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// What a watch request asked for.
pub struct WatchRequest {
    pub rt: &'static ResourceType,
    pub namespace: Option<String>,
    pub labels: Selector,
    pub fields: Selector,
    pub resource_version: Option<String>,
    pub timeout: Duration,
    pub bookmarks: bool,
}

struct StreamState {
    receiver: mpsc::UnboundedReceiver<WatchFrame>,
    sender: mpsc::UnboundedSender<WatchFrame>,
    shared: Arc<Shared>,
    rt: &'static ResourceType,
    deadline: Instant,
    next_bookmark: Option<Instant>,
}

/// Opens a watch: the newline-delimited JSON events the client reads.
pub fn open(
    shared: &Arc<Shared>,
    request: WatchRequest,
) -> Result<impl Stream<Item = Bytes> + Send + 'static, ApiError> {
    let (sender, receiver) = mpsc::unbounded_channel();
    let since = match request.resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(text) => Some(
            text.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("invalid resourceVersion {text}")))?,
        ),
    };
    let watcher = Watcher {
        resource: request.rt.id(),
        namespace: request.namespace.clone(),
        labels: request.labels,
        fields: request.fields,
        sender: sender.clone(),
    };
    {
        // Replay and registration under one lock: no change is missed or sent twice.
        let mut store = shared.store();
        match since {
            None => {
                let current = store.list(&watcher.resource, watcher.namespace.as_deref());
                for object in current.into_iter().filter(|object| {
                    watcher.labels.matches_labels(object) && watcher.fields.matches_fields(object)
                }) {
                    sender.send(WatchFrame::Event("ADDED", object)).ok();
                }
            }
            Some(since) if since < store.compacted => {
                let expired = ApiError::new(
                    410,
                    "Expired",
                    format!(
                        "too old resource version: {since} ({})",
                        store.compacted + 1
                    ),
                );
                let frame = encode(request.rt, WatchFrame::Event("ERROR", expired.status()));
                return Ok(futures::stream::iter(vec![frame]).left_stream());
            }
            Some(since) => {
                for change in store.history.iter().filter(|c| c.resource_version > since) {
                    if let Some((kind, object)) = watcher.event_for(change) {
                        sender.send(WatchFrame::Event(kind, object)).ok();
                    }
                }
            }
        }
        store.watchers.push(watcher);
    }
    let now = Instant::now();
    let state = StreamState {
        receiver,
        sender,
        shared: shared.clone(),
        rt: request.rt,
        deadline: now + request.timeout,
        next_bookmark: request.bookmarks.then(|| now + BOOKMARK_INTERVAL),
    };
    Ok(futures::stream::unfold(state, next_frame).right_stream())
}

async fn next_frame(mut state: StreamState) -> Option<(Bytes, StreamState)> {
    loop {
        let bookmark_due = state.next_bookmark.unwrap_or(state.deadline);
        tokio::select! {
            frame = state.receiver.recv() => {
                let frame = frame?;
                // A held watch lags: its events wait, in order, until released.
                let mut held = state.shared.held_watches.subscribe();
                let resource = state.rt.id();
                held.wait_for(|held| !held.contains(&resource)).await.ok();
                return Some((encode(state.rt, frame), state));
            }
            () = tokio::time::sleep_until(state.deadline) => return None,
            () = tokio::time::sleep_until(bookmark_due), if state.next_bookmark.is_some() => {
                // Queued behind every event already sent to this watcher, so its RV is honest.
                let store = state.shared.store();
                state.sender.send(WatchFrame::Bookmark(store.resource_version)).ok();
                state.next_bookmark = Some(bookmark_due + BOOKMARK_INTERVAL);
            }
        }
    }
}

fn encode(rt: &ResourceType, frame: WatchFrame) -> Bytes {
    let event: Value = match frame {
        WatchFrame::Event(kind, object) => json!({"type": kind, "object": object}),
        WatchFrame::Bookmark(rv) => json!({
            "type": "BOOKMARK",
            "object": {
                "apiVersion": rt.api_version(), "kind": rt.kind,
                "metadata": {"resourceVersion": rv.to_string(), "annotations": {}},
            },
        }),
    };
    let mut line = serde_json::to_vec(&event).expect("events serialize");
    line.push(b'\n');
    Bytes::from(line)
}
