//! GET_ROUTEINFO_BY_TOPIC (105) and GET_BROKER_CLUSTER_INFO (106): the broker answers as the
//! name server, for the whole cluster (itself and its peers).

use std::collections::BTreeMap;

use quiver_protocol::code::response;
use quiver_protocol::RemotingCommand;
use serde_json::json;

use super::{success_json, Ctx, Fields, Outcome, Refusal};
use crate::broker::Broker;
use crate::topics::{validate_topic_name, TopicConfig, RETRY_PREFIX};

/// One broker of the cluster as a route sees it.
struct Member {
    name: String,
    cluster: String,
    address: String,
    permission: u32,
    topic: Option<TopicConfig>,
}

fn members(broker: &Broker, topic: &str) -> Vec<Member> {
    let mut all = vec![Member {
        name: broker.config.broker_name.clone(),
        cluster: broker.config.cluster.clone(),
        address: broker.advertised.clone(),
        permission: broker.permission(),
        topic: broker.topics.get(topic),
    }];
    for peer in broker.peers.snapshot() {
        all.push(Member {
            topic: peer.topics.get(topic).cloned(),
            name: peer.broker_name,
            cluster: if peer.cluster.is_empty() {
                broker.config.cluster.clone()
            } else {
                peer.cluster
            },
            address: peer.address,
            permission: peer.permission,
        });
    }
    all
}

pub fn route(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let broker = &ctx.broker;
    let topic = Fields(req).str("topic")?.to_string();
    let mut cluster = members(broker, &topic);
    if cluster.iter().all(|member| member.topic.is_none()) {
        let creatable = broker.config.auto_create_topics && validate_topic_name(&topic).is_ok();
        if !creatable {
            return Err(Refusal::new(
                response::TOPIC_NOT_EXIST,
                format!("no route for topic {topic}"),
            ));
        }
        // Auto-create on lookup: the quick start's producer and consumer need a route first.
        let queues = match topic.strip_prefix(RETRY_PREFIX) {
            Some(group) => broker.groups.get_or_create(group).retry_queue_nums.max(1),
            None => broker.config.default_queue_nums,
        };
        let (config, _) = broker.topics.get_or_create(&topic, queues);
        tracing::info!(topic, "topic auto-created on route lookup");
        cluster[0].topic = Some(config);
    }
    let mut queue_datas = Vec::new();
    let mut broker_datas = Vec::new();
    for member in &cluster {
        let Some(config) = &member.topic else {
            continue;
        };
        queue_datas.push(json!({
            "brokerName": member.name,
            "readQueueNums": config.read_queue_nums,
            "writeQueueNums": config.write_queue_nums,
            "perm": config.perm & member.permission,
            "topicSysFlag": config.topic_sys_flag,
        }));
        broker_datas.push(json!({
            "cluster": member.cluster,
            "brokerName": member.name,
            "brokerAddrs": { "0": member.address },
            "enableActingMaster": false,
        }));
    }
    Ok(success_json(
        req,
        &json!({
            "queueDatas": queue_datas,
            "brokerDatas": broker_datas,
            "filterServerTable": {},
        }),
    ))
}

pub fn cluster_info(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let mut broker_addr_table = BTreeMap::new();
    let mut cluster_addr_table: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for member in members(&ctx.broker, "") {
        broker_addr_table.insert(
            member.name.clone(),
            json!({
                "cluster": member.cluster,
                "brokerName": member.name,
                "brokerAddrs": { "0": member.address },
                "enableActingMaster": false,
            }),
        );
        cluster_addr_table
            .entry(member.cluster)
            .or_default()
            .push(member.name);
    }
    Ok(success_json(
        req,
        &json!({
            "brokerAddrTable": broker_addr_table,
            "clusterAddrTable": cluster_addr_table,
        }),
    ))
}
