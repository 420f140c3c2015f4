//! Replicas copy the master's topics and subscription groups every second (Apache's
//! SlaveSynchronize does the same). Consumer offsets reach them through the state log
//! (`crate::state_log`), with the CommitLog; the master's offset table only fills in queues
//! a replica has no offset for (a member rebuilt past the state log's retention).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use quiver_protocol::body::{SubscriptionGroupWrapper, TopicConfigSerializeWrapper};
use quiver_protocol::code::{request, response};
use quiver_protocol::RemotingCommand;
use quiver_store::QueueOffset;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::Member;
use super::{Replication, Role};
use crate::periodic::{periodic, Flow};
use std::ops::ControlFlow;

const SYNC_INTERVAL: Duration = Duration::from_secs(1);
const SYNC_TIMEOUT: Duration = Duration::from_secs(3);

/// GET_ALL_CONSUMER_OFFSET's body: `{"offsetTable":{"topic@group":{queueId:offset}}}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ConsumerOffsetTable {
    pub offset_table: BTreeMap<String, BTreeMap<u32, u64>>,
}

/// Every committed offset of `broker`, keyed `topic@group` as Apache's file is.
pub fn offset_table(broker: &dyn Member) -> ConsumerOffsetTable {
    let mut table = BTreeMap::new();
    for group in broker.offsets().groups() {
        for topic in broker.offsets().topics_of(&group) {
            let queues = broker
                .offsets()
                .table(&group, &topic)
                .into_iter()
                .map(|(queue, offset)| (queue, offset.0))
                .collect();
            table.insert(format!("{topic}@{group}"), queues);
        }
    }
    ConsumerOffsetTable {
        offset_table: table,
    }
}

#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error(transparent)]
    Link(#[from] super::links::LinkError),
    #[error("the master answered {code} to request {request}")]
    Refused { request: i32, code: i32 },
    #[error("unreadable {what}: {reason}")]
    Body { what: &'static str, reason: String },
}

/// Every [`SYNC_INTERVAL`] on a replica: learns the master's gRPC endpoint and copies its
/// topics, groups and offsets.
pub(super) async fn run(
    broker: Arc<dyn Member>,
    replication: Arc<Replication>,
    stop: watch::Receiver<bool>,
) {
    let round = move || sync_round(broker.clone(), replication.clone());
    // A task of its own: there the compiler proves the loop's future Send.
    let copying = periodic(
        "copying the master's metadata",
        SYNC_INTERVAL,
        None,
        stop,
        round,
    );
    let _ = tokio::spawn(copying).await;
}

async fn sync_round(broker: Arc<dyn Member>, replication: Arc<Replication>) -> Flow {
    let Role::Replica { master, .. } = replication.role() else {
        return ControlFlow::Continue(None);
    };
    let address = replication.address_of(master);
    if let Err(error) = learn_master_grpc(&replication, master, &address).await {
        tracing::debug!(error = %crate::error::chain(&error), "cannot learn the master's gRPC endpoint now");
    }
    if let Err(error) = sync_once(&*broker, &replication, &address).await {
        tracing::debug!(error = %crate::error::chain(&error), "cannot copy the master's topics, groups and offsets now");
    }
    ControlFlow::Continue(None)
}

async fn ask(
    replication: &Replication,
    address: &str,
    code: i32,
) -> Result<bytes::Bytes, SyncError> {
    let request = RemotingCommand::request(code, Default::default());
    let answer = replication
        .links
        .request(address, request, SYNC_TIMEOUT)
        .await?;
    if answer.code != response::SUCCESS {
        return Err(SyncError::Refused {
            request: code,
            code: answer.code,
        });
    }
    Ok(answer.body)
}

/// The master's `grpcEndpoint` (GET_BROKER_CONFIG), for the 5.x routes a replica answers.
async fn learn_master_grpc(
    replication: &Replication,
    master: u64,
    address: &str,
) -> Result<(), SyncError> {
    let config = ask(replication, address, request::GET_BROKER_CONFIG).await?;
    let endpoint = String::from_utf8_lossy(&config)
        .lines()
        .filter_map(|line| line.split_once('='))
        .find(|(key, _)| key.trim() == crate::peers::GRPC_ENDPOINT_KEY)
        .map(|(_, value)| value.trim().to_owned())
        .filter(|value| !value.is_empty());
    *replication.master_grpc.lock() = endpoint.map(|endpoint| (master, endpoint));
    Ok(())
}

async fn sync_once(
    broker: &dyn Member,
    replication: &Replication,
    address: &str,
) -> Result<(), SyncError> {
    let body_error = |what: &'static str| {
        move |error: quiver_protocol::BodyError| SyncError::Body {
            what,
            reason: crate::error::chain(&error),
        }
    };
    let topics = ask(replication, address, request::GET_ALL_TOPIC_CONFIG).await?;
    let topics = TopicConfigSerializeWrapper::decode(&topics).map_err(body_error("topics"))?;
    let groups = ask(
        replication,
        address,
        request::GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
    )
    .await?;
    let groups = SubscriptionGroupWrapper::decode(&groups).map_err(body_error("groups"))?;
    let deletions = broker.offsets().deletions();
    let offsets = ask(replication, address, request::GET_ALL_CONSUMER_OFFSET).await?;
    let offsets: ConsumerOffsetTable =
        quiver_protocol::body::decode_json(&offsets, "offsets").map_err(body_error("offsets"))?;
    apply(broker, topics, groups, offsets, deletions);
    Ok(())
}

/// Makes this member's topics and groups the master's, and fills in offsets it lacks from
/// the master's table, read when this member had applied `deletions` group deletions.
fn apply(
    broker: &dyn Member,
    topics: TopicConfigSerializeWrapper,
    groups: SubscriptionGroupWrapper,
    offsets: ConsumerOffsetTable,
    deletions: u64,
) {
    let wanted: BTreeSet<String> = topics.topic_config_table.keys().cloned().collect();
    for config in broker.topics().all() {
        if !wanted.contains(&config.topic_name) {
            broker.topics().remove(&config.topic_name);
        }
    }
    for (_, config) in topics.topic_config_table {
        if broker.topics().get(&config.topic_name).as_ref() != Some(&config) {
            broker.topics().upsert(config);
        }
    }
    let wanted: BTreeSet<&String> = groups.subscription_group_table.keys().collect();
    for name in broker.groups().all().keys() {
        if !wanted.contains(name) {
            broker.groups().remove(name);
        }
    }
    for (_, config) in groups.subscription_group_table {
        broker.groups().upsert(config);
    }
    fill_absent_offsets(broker, offsets, deletions);
}

/// Sets the master's offsets of queues this member has none for; the state log keeps the
/// others, in order (copying them would move an offset back to a stale read of the table).
/// Skipped when a group deletion was applied since the table was read: it may name the
/// deleted group (the next round fills in).
fn fill_absent_offsets(broker: &dyn Member, offsets: ConsumerOffsetTable, deletions: u64) {
    // Under the state log's position: nothing applies a record while the table is filled.
    let _position = broker.offsets().log_position();
    if broker.offsets().deletions() != deletions {
        return;
    }
    for (key, queues) in offsets.offset_table {
        let Some((topic, group)) = key.split_once('@') else {
            continue;
        };
        let queues: Vec<(u32, QueueOffset)> = queues
            .into_iter()
            .map(|(queue, offset)| (queue, QueueOffset(offset)))
            .collect();
        broker.offsets().insert_absent(group, topic, &queues);
    }
}

/// On becoming master, before taking writes: applies the state log this member holds
/// ([`Member::apply_held_state`]), then moves every committed offset to at most the end of
/// what this member wrote to its queue. An offset past it (async mode's lag, a tail the old
/// master had alone) would make consumers skip what this master writes there; clamped, they
/// are redelivered what they may have read, never skip. Returns how many offsets moved.
pub(super) fn clamp_offsets_to_log(broker: &dyn Member) -> usize {
    match broker.apply_held_state() {
        Ok(applied) => tracing::info!(applied, "state log applied before taking writes"),
        Err(error) => {
            tracing::error!(error = %crate::error::chain(&error), "cannot apply the state log before taking writes")
        }
    }
    let mut moved = 0;
    for group in broker.offsets().groups() {
        for topic in broker.offsets().topics_of(&group) {
            let table = broker.offsets().table(&group, &topic);
            let queues: BTreeMap<u32, u64> = table.iter().map(|(q, o)| (*q, o.0)).collect();
            let clamped = clamp_to_queue_ends(queues, |queue| {
                broker.store().written_max_offset(&topic, queue)
            });
            let changed: Vec<(u32, QueueOffset)> = clamped
                .into_iter()
                .filter(|(queue, offset)| table.get(queue) != Some(offset))
                .collect();
            if !changed.is_empty() {
                moved += changed.len();
                broker.offsets().reset(&group, &topic, &changed);
            }
        }
    }
    moved
}

fn clamp_to_queue_ends(
    queues: BTreeMap<u32, u64>,
    end_of: impl Fn(u32) -> QueueOffset,
) -> Vec<(u32, QueueOffset)> {
    queues
        .into_iter()
        .map(|(queue, offset)| (queue, QueueOffset(offset.min(end_of(queue).0))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copied_offsets_never_point_past_this_members_queues() {
        let master = BTreeMap::from([(0, 120), (1, 40), (2, 7)]);
        let ends = [100, 40, 0];
        let copied = clamp_to_queue_ends(master, |queue| QueueOffset(ends[queue as usize]));
        assert_eq!(
            copied,
            vec![
                (0, QueueOffset(100)),
                (1, QueueOffset(40)),
                (2, QueueOffset(0))
            ]
        );
    }
}
