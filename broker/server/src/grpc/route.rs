//! QueryRoute and QueryAssignment: the cluster's queues, each pointing at the gRPC endpoint
//! of the broker holding it (this broker and every peer that serves gRPC).

use quiver_grpc_proto::v2::{
    self, AddressScheme, Assignment, Code, MessageQueue, MessageType, Permission,
};
use quiver_protocol::body::{perm, TopicConfig};

use super::status::{self, ok, status};
use crate::broker::Broker;
use crate::service::route::create_on_lookup;

/// Quiver's topics take every message type (they carry no `message.type` attribute).
const ACCEPTED_TYPES: [MessageType; 4] = [
    MessageType::Normal,
    MessageType::Fifo,
    MessageType::Delay,
    MessageType::Transaction,
];

/// One broker of the cluster that serves gRPC, as a route sees it.
struct Member {
    name: String,
    endpoint: String,
    permission: i32,
    topic: Option<TopicConfig>,
}

fn members(broker: &Broker, topic: &str) -> Vec<Member> {
    let own = broker
        .grpc()
        .advertised
        .get()
        .map(|endpoint| own_member(broker, endpoint, topic));
    let peers = broker.peers().snapshot().into_iter().filter_map(|peer| {
        Some(Member {
            endpoint: peer.grpc_endpoint?,
            topic: peer.topics.get(topic).cloned(),
            name: peer.broker_name,
            permission: peer.permission,
        })
    });
    own.into_iter().chain(peers).collect()
}

/// This broker as routes name it: itself, or, as a replica of a group, its master; with no
/// master known, itself read-only (consumers may read from replicas).
fn own_member(broker: &Broker, endpoint: &str, topic: &str) -> Member {
    let routed = match broker.replication() {
        Some(replication) => replication.grpc_route_endpoint(endpoint),
        None => Some(endpoint.to_owned()),
    };
    let (endpoint, permission) = match routed {
        Some(routed) => (routed, broker.permission()),
        None => (endpoint.to_owned(), broker.permission() & perm::READ),
    };
    Member {
        name: broker.config().broker_name.clone(),
        endpoint,
        permission,
        topic: broker.topics().get(topic),
    }
}

/// The members holding `topic`, creating it here when no one does and the route service
/// allows it (`may_create`: the caller may send to it); TOPIC_NOT_FOUND otherwise.
fn members_with_topic(
    broker: &Broker,
    topic: &str,
    may_create: bool,
) -> Result<Vec<Member>, v2::Status> {
    let mut cluster = members(broker, topic);
    if cluster.iter().all(|member| member.topic.is_none()) {
        if cluster.is_empty() {
            return Err(status(
                Code::TopicNotFound,
                format!("no route for topic {topic}"),
            ));
        }
        let config = create_on_lookup(broker, topic, || may_create).map_err(status::of_service)?;
        cluster[0].topic = Some(config);
    }
    Ok(cluster
        .into_iter()
        .filter(|member| member.topic.is_some())
        .collect())
}

/// The Endpoints of a host:port.
pub(crate) fn endpoints(address: &str) -> v2::Endpoints {
    let (host, port) = address.rsplit_once(':').unwrap_or((address, "0"));
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let scheme = match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(_)) => AddressScheme::IPv4,
        Ok(std::net::IpAddr::V6(_)) => AddressScheme::IPv6,
        Err(_) => AddressScheme::DomainName,
    };
    v2::Endpoints {
        scheme: scheme as i32,
        addresses: vec![v2::Address {
            host: host.to_owned(),
            port: port.parse().unwrap_or(0),
        }],
    }
}

fn broker_of(member: &Member) -> v2::Broker {
    v2::Broker {
        name: member.name.clone(),
        id: 0,
        endpoints: Some(endpoints(&member.endpoint)),
    }
}

fn queue(topic: &str, id: i32, permission: Permission, broker: v2::Broker) -> MessageQueue {
    MessageQueue {
        topic: Some(v2::Resource {
            resource_namespace: String::new(),
            name: topic.to_owned(),
        }),
        id,
        permission: permission as i32,
        broker: Some(broker),
        accept_message_types: ACCEPTED_TYPES.iter().map(|t| *t as i32).collect(),
    }
}

/// Queue `id`'s permission: read below the read queue count, write below the write count,
/// both cut by the topic's and the broker's permission.
fn queue_permission(config: &TopicConfig, broker_permission: i32, id: u32) -> Permission {
    let allowed = config.perm & broker_permission;
    let read = id < config.read_queue_nums && perm::is_readable(allowed);
    let write = id < config.write_queue_nums && perm::is_writeable(allowed);
    match (read, write) {
        (true, true) => Permission::ReadWrite,
        (true, false) => Permission::Read,
        (false, true) => Permission::Write,
        (false, false) => Permission::None,
    }
}

pub(crate) fn query_route(
    broker: &Broker,
    topic: &str,
    may_create: bool,
) -> Result<v2::QueryRouteResponse, v2::Status> {
    let cluster = members_with_topic(broker, topic, may_create)?;
    let mut message_queues = Vec::new();
    for member in &cluster {
        let Some(config) = &member.topic else {
            continue;
        };
        for id in 0..config.read_queue_nums.max(config.write_queue_nums) {
            let permission = queue_permission(config, member.permission, id);
            let id = i32::try_from(id).unwrap_or(i32::MAX);
            message_queues.push(queue(topic, id, permission, broker_of(member)));
        }
    }
    Ok(v2::QueryRouteResponse {
        status: Some(ok()),
        message_queues,
    })
}

/// POP consumers are assigned whole brokers (queue id -1, as Apache's Proxy answers): each
/// broker with a readable queue of the topic.
pub(crate) fn query_assignment(
    broker: &Broker,
    topic: &str,
) -> Result<v2::QueryAssignmentResponse, v2::Status> {
    let cluster = members_with_topic(broker, topic, false)?;
    let assignments = cluster
        .iter()
        .filter(|member| {
            member.topic.as_ref().is_some_and(|config| {
                config.read_queue_nums > 0 && perm::is_readable(config.perm & member.permission)
            })
        })
        .map(|member| Assignment {
            message_queue: Some(queue(topic, -1, Permission::ReadWrite, broker_of(member))),
        })
        .collect();
    Ok(v2::QueryAssignmentResponse {
        status: Some(ok()),
        assignments,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_name_their_scheme() {
        let v4 = endpoints("10.0.0.1:8081");
        assert_eq!(v4.scheme, AddressScheme::IPv4 as i32);
        assert_eq!(v4.addresses[0].port, 8081);
        let dns = endpoints("broker-0.quiver-headless.ns.svc:8081");
        assert_eq!(dns.scheme, AddressScheme::DomainName as i32);
        assert_eq!(dns.addresses[0].host, "broker-0.quiver-headless.ns.svc");
        assert_eq!(endpoints("[::1]:8081").scheme, AddressScheme::IPv6 as i32);
    }

    #[test]
    fn queue_permissions_follow_counts_and_permissions() {
        let config = TopicConfig {
            read_queue_nums: 2,
            write_queue_nums: 3,
            perm: perm::READ_WRITE,
            ..TopicConfig::default()
        };
        assert_eq!(
            queue_permission(&config, perm::READ_WRITE, 0),
            Permission::ReadWrite
        );
        assert_eq!(
            queue_permission(&config, perm::READ_WRITE, 2),
            Permission::Write
        );
        assert_eq!(
            queue_permission(&config, perm::READ_ONLY, 0),
            Permission::Read
        );
        assert_eq!(
            queue_permission(&config, perm::READ_ONLY, 2),
            Permission::None
        );
    }
}
