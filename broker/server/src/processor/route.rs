//! GET_ROUTEINFO_BY_TOPIC (105) and GET_BROKER_CLUSTER_INFO (106): the broker answers as the
//! name server, for the whole cluster (itself and its peers).

use std::collections::BTreeMap;

use quiver_protocol::body::{BrokerData, ClusterInfo, QueueData, TopicRouteData, MASTER_BROKER_ID};
use quiver_protocol::code::response;
use quiver_protocol::header::GetRouteInfoRequestHeader;
use quiver_protocol::RemotingCommand;

use super::{Ctx, Outcome};
use crate::broker::Broker;
use crate::service::route::create_on_lookup;
use crate::topics::TopicConfig;

/// One broker of the cluster as a route sees it.
struct Member {
    name: String,
    cluster: String,
    /// By broker id: the master as 0, a group's replicas after it.
    addresses: BTreeMap<i64, String>,
    permission: i32,
    topic: Option<TopicConfig>,
}

fn members(broker: &Broker, topic: &str) -> Vec<Member> {
    let mut all = vec![Member {
        name: broker.config().broker_name.clone(),
        cluster: broker.config().cluster.clone(),
        addresses: match &broker.replication() {
            Some(replication) => replication.route_addresses(),
            None => BTreeMap::from([(MASTER_BROKER_ID, broker.advertised().to_owned())]),
        },
        permission: broker.permission(),
        topic: broker.topics().get(topic),
    }];
    for peer in broker.peers().snapshot() {
        // Several members of one peer group may be listed: the group is routed once.
        if all.iter().any(|member| member.name == peer.broker_name) {
            continue;
        }
        all.push(Member {
            topic: peer.topics.get(topic).cloned(),
            name: peer.broker_name,
            cluster: if peer.cluster.is_empty() {
                broker.config().cluster.clone()
            } else {
                peer.cluster
            },
            addresses: peer.addresses,
            permission: peer.permission,
        });
    }
    all
}

pub fn route(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let topic = GetRouteInfoRequestHeader::from_command(req)?.topic;
    let mut cluster = members(broker, &topic);
    if cluster.iter().all(|member| member.topic.is_none()) {
        let config = create_on_lookup(broker, &topic, || may_create(ctx, req, &topic))?;
        cluster[0].topic = Some(config);
    }
    let mut route = TopicRouteData::default();
    for member in cluster {
        let Some(config) = member.topic else { continue };
        route.queue_datas.push(QueueData {
            broker_name: member.name.clone(),
            read_queue_nums: config.read_queue_nums,
            write_queue_nums: config.write_queue_nums,
            perm: config.perm & member.permission,
            topic_sys_flag: config.topic_sys_flag,
        });
        route
            .broker_datas
            .push(broker_data(member.cluster, member.name, member.addresses));
    }
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(route.encode()))
}

/// With ACL on, lookups are answered to anyone but create topics only for accounts that
/// may send to them.
fn may_create(ctx: &Ctx, req: &RemotingCommand, topic: &str) -> bool {
    match &ctx.broker.acl() {
        Some(acl) => acl.may_create_topic(req, ctx.connection.remote.ip(), topic),
        None => true,
    }
}

fn broker_data(
    cluster: String,
    broker_name: String,
    addresses: BTreeMap<i64, String>,
) -> BrokerData {
    BrokerData {
        cluster,
        broker_name,
        broker_addrs: addresses,
        enable_acting_master: false,
    }
}

pub fn cluster_info(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let mut info = ClusterInfo::default();
    for member in members(&ctx.broker, "") {
        info.cluster_addr_table
            .entry(member.cluster.clone())
            .or_default()
            .insert(member.name.clone());
        info.broker_addr_table.insert(
            member.name.clone(),
            broker_data(member.cluster, member.name, member.addresses),
        );
    }
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(info.encode()))
}
