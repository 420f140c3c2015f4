//! The calls of `mqadmin` and the dashboard, answered as Apache's broker and name server
//! answer them: topic lists (206, 224, 304, 305), DELETE_TOPIC_IN_NAMESRV (216),
//! QUERY_TOPIC_CONSUME_BY_WHO (300), GET_PRODUCER_CONNECTION_LIST (204), CLONE_GROUP_OFFSET (314).

use std::collections::BTreeSet;

use quiver_protocol::body::{Connection, GroupList, ProducerConnection, TopicList};
use quiver_protocol::code::response;
use quiver_protocol::header::{
    CloneGroupOffsetRequestHeader, DeleteTopicFromNamesrvRequestHeader,
    GetProducerConnectionListRequestHeader, GetTopicsByClusterRequestHeader,
    QueryTopicConsumeByWhoRequestHeader,
};
use quiver_protocol::RemotingCommand;

use super::{success, Ctx, Outcome, Refusal};
use crate::broker::Broker;
use crate::state_log::{self, StateRecord};
use crate::topics::{DEFAULT_TOPIC, SCHEDULE_TOPIC};
use crate::transaction;

/// Topics Apache counts as system topics (`TopicValidator`), where this broker has them.
const SYSTEM_TOPICS: [&str; 6] = [
    DEFAULT_TOPIC,
    SCHEDULE_TOPIC,
    transaction::HALF_TOPIC,
    transaction::OP_TOPIC,
    transaction::CHECK_MAX_TIME_TOPIC,
    crate::timer::TIMER_TOPIC,
];

fn with_body(req: &RemotingCommand, body: bytes::Bytes) -> RemotingCommand {
    req.response_to(response::SUCCESS, None).with_body(body)
}

/// Every broker of the cluster with its cluster name and topic names: this one, then its peers.
fn cluster_topics(broker: &Broker) -> Vec<(String, BTreeSet<String>)> {
    let own = broker.topics().all().into_iter().map(|t| t.topic_name);
    let mut members = vec![(broker.config().cluster.clone(), own.collect())];
    for peer in broker.peers().snapshot() {
        let cluster = if peer.cluster.is_empty() {
            broker.config().cluster.clone()
        } else {
            peer.cluster
        };
        members.push((cluster, peer.topics.into_keys().collect()));
    }
    members
}

/// GET_ALL_TOPIC_LIST_FROM_NAMESERVER (206): every topic of the cluster.
pub fn all_topic_list(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    Ok(topic_list(ctx, req, |_| true))
}

/// GET_TOPICS_BY_CLUSTER (224): the topics of the cluster's brokers (none for an unknown one).
pub fn topics_by_cluster(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let cluster = GetTopicsByClusterRequestHeader::from_command(req)?.cluster;
    Ok(topic_list(ctx, req, |name| *name == cluster))
}

/// The topics of the cluster's brokers whose name `keep` accepts, as a TopicList body.
fn topic_list(ctx: &Ctx, req: &RemotingCommand, keep: impl Fn(&String) -> bool) -> RemotingCommand {
    let topics: BTreeSet<String> = cluster_topics(&ctx.broker)
        .into_iter()
        .filter(|(name, _)| keep(name))
        .flat_map(|(_, topics)| topics)
        .collect();
    let list = TopicList {
        topic_list: topics.into_iter().collect(),
        broker_addr: None,
    };
    with_body(req, list.encode())
}

/// GET_SYSTEM_TOPIC_LIST_FROM_NS (304): as Apache's name server, the cluster names and broker
/// names (each broker's own system topic), with one broker's address.
pub fn system_topics_from_ns(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let mut names = BTreeSet::from([
        broker.config().cluster.clone(),
        broker.config().broker_name.clone(),
    ]);
    for peer in broker.peers().snapshot() {
        if !peer.cluster.is_empty() {
            names.insert(peer.cluster);
        }
        names.insert(peer.broker_name);
    }
    let list = TopicList {
        topic_list: names.into_iter().collect(),
        broker_addr: Some(broker.advertised().to_owned()),
    };
    Ok(with_body(req, list.encode()))
}

/// GET_SYSTEM_TOPIC_LIST_FROM_BROKER (305): this broker's system topics, its cluster and broker
/// names included, as Apache's `TopicConfigManager.getSystemTopic`.
pub fn system_topics_from_broker(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let mut names = BTreeSet::from([
        broker.config().cluster.clone(),
        broker.config().broker_name.clone(),
    ]);
    for topic in SYSTEM_TOPICS {
        if broker.topics().get(topic).is_some() {
            names.insert(topic.to_owned());
        }
    }
    let list = TopicList {
        topic_list: names.into_iter().collect(),
        broker_addr: None,
    };
    Ok(with_body(req, list.encode()))
}

/// DELETE_TOPIC_IN_NAMESRV (216): routes are built from the brokers' topics, so there is
/// nothing to forget once this broker deleted the topic (215, as `mqadmin deleteTopic` sends
/// first); while it still holds the topic, its route would be served again, so it is refused.
pub fn delete_topic_in_namesrv(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let topic = DeleteTopicFromNamesrvRequestHeader::from_command(req)?.topic;
    if ctx.broker.topics().get(&topic).is_some() {
        return Err(Refusal::new(
            response::SYSTEM_ERROR,
            format!(
                "topic {topic} still exists on broker {}: delete it there first \
                 (DELETE_TOPIC_IN_BROKER, 215); Quiver's routes come from the brokers' topics",
                ctx.broker.config().broker_name
            ),
        ));
    }
    Ok(success(req, &[]))
}

/// QUERY_TOPIC_CONSUME_BY_WHO (300): online groups subscribed to the topic, and groups with
/// offsets on it.
pub fn topic_consumed_by(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let topic = QueryTopicConsumeByWhoRequestHeader::from_command(req)?.topic;
    let broker = &ctx.broker;
    let online = broker
        .consumers()
        .online_groups()
        .into_iter()
        .filter(|group| broker.consumers().subscription(group, &topic).is_some());
    let committed = broker
        .offsets()
        .groups()
        .into_iter()
        .filter(|group| broker.offsets().topics_of(group).contains(&topic));
    let groups: BTreeSet<String> = online.chain(committed).collect();
    let list = GroupList {
        group_list: groups.into_iter().collect(),
    };
    Ok(with_body(req, list.encode()))
}

/// GET_PRODUCER_CONNECTION_LIST (204): the group's online producers, or Apache's refusal.
pub fn producer_connections(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let group = GetProducerConnectionListRequestHeader::from_command(req)?.producer_group;
    let clients = ctx.broker.producers().clients(&group);
    if clients.is_empty() {
        return Err(Refusal::new(
            response::SYSTEM_ERROR,
            format!("the producer group[{group}] not exist"),
        ));
    }
    let body = ProducerConnection {
        connection_set: clients
            .into_iter()
            .map(|client| Connection {
                client_id: client.client_id,
                client_addr: client.connection.remote.to_string(),
                language: client.language,
                version: client.version,
            })
            .collect(),
    };
    Ok(with_body(req, body.encode()))
}

/// CLONE_GROUP_OFFSET (314): copies the source group's offsets to the destination group, per
/// topic (every topic of the source group without one).
pub async fn clone_group_offset(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = CloneGroupOffsetRequestHeader::from_command(req)?;
    let broker = &ctx.broker;
    let topics = match header.topic.clone().filter(|topic| !topic.is_empty()) {
        Some(topic) => vec![topic],
        None => broker.offsets().topics_of(&header.src_group),
    };
    let source_online = broker.consumers().group(&header.src_group);
    for topic in topics {
        if broker.topics().get(&topic).is_none() {
            continue;
        }
        // As Apache: an online source group's offsets count only on topics it subscribes to.
        let unsubscribed = source_online
            .as_ref()
            .is_some_and(|group| !group.subscriptions.contains_key(&topic));
        if header.offline != Some(true) && unsubscribed {
            continue;
        }
        let offsets: Vec<_> = broker
            .offsets()
            .table(&header.src_group, &topic)
            .into_iter()
            .collect();
        let record = StateRecord::commit(
            &header.dest_group,
            &topic,
            offsets.iter().map(|(q, o)| (*q, o.0)),
        );
        state_log::write(broker, &record).await?;
        tracing::info!(src = %header.src_group, dest = %header.dest_group, topic, queues = offsets.len(), "group offsets cloned");
    }
    Ok(success(req, &[]))
}
