//! `BrokerAdmin` over quiver-client's admin: the client's one connection per broker address
//! and its per-broker calls, with the answers turned into the operator's types.

use crate::admin::{
    account_scope, AdminError, BrokerAccess, BrokerAddr, BrokerAdmin, BrokerPermission,
    ConsumeStats, MembershipChange, QueueConsumeStats, QueueOffset, QueueTopicStats,
    ReplicationStatus, ResetTarget, RuntimeInfo, SubscriptionGroup, TopicConfig, TopicStats,
};
use futures::future::{BoxFuture, FutureExt};
use quiver_client::{Admin, ClientConfig, ClientError, TopicSpec};
use quiver_protocol::body::SubscriptionGroupConfig;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Default bound on one call: connect, send, and read the response.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a membership change's answer may take beyond the change's own timeout.
const MEMBERSHIP_ANSWER_SLACK: Duration = Duration::from_secs(5);

/// Talks to brokers directly by address, reaching a Broker resource's brokers with the access
/// (account, TLS) [`BrokerAdmin::use_access`] gave for them.
pub struct RemotingAdmin {
    call_timeout: Duration,
    unsigned: Arc<Admin>,
    /// Per [`crate::admin::account_scope`]: the access and the client using it.
    scoped: Mutex<HashMap<String, (BrokerAccess, Arc<Admin>)>>,
}

impl Default for RemotingAdmin {
    fn default() -> Self {
        RemotingAdmin::new(DEFAULT_CALL_TIMEOUT)
    }
}

impl RemotingAdmin {
    /// An admin whose calls each take at most `call_timeout`. It needs no name server: every
    /// call names its broker.
    pub fn new(call_timeout: Duration) -> RemotingAdmin {
        RemotingAdmin {
            call_timeout,
            unsigned: Arc::new(Admin::new(Self::config(call_timeout))),
            scoped: Mutex::new(HashMap::new()),
        }
    }

    fn config(call_timeout: Duration) -> ClientConfig {
        ClientConfig::new("").with_request_timeout(call_timeout)
    }

    /// A client config with `access`'s account and TLS.
    fn config_with(call_timeout: Duration, access: &BrokerAccess) -> ClientConfig {
        let mut config = Self::config(call_timeout);
        if let Some(account) = &access.account {
            config = config.with_credentials(&account.access_key, &account.secret_key);
        }
        if let Some(tls) = &access.tls {
            config = config.with_tls(tls.clone());
        }
        config
    }

    /// The access calls to `addr` use (the default: unsigned and plain).
    fn access_for(&self, addr: &BrokerAddr) -> BrokerAccess {
        let scoped = self.scoped.lock().expect("scoped admins lock poisoned");
        scoped
            .get(account_scope(addr))
            .map(|(access, _)| access.clone())
            .unwrap_or_default()
    }

    /// QUIVER_REPLICATION_MEMBERS on a client of its own: the change may take longer than
    /// the shared clients' request timeout (a new member catches up first), and changes are
    /// rare enough that a connection each costs nothing.
    async fn membership_call(
        &self,
        addr: &BrokerAddr,
        change: &MembershipChange,
        timeout: Duration,
    ) -> Result<BTreeMap<u64, String>, ClientError> {
        let (address, new_member_id) = match change {
            MembershipChange::Add { address, .. } => (Some(address.clone()), None),
            MembershipChange::Remove { .. } => (None, None),
        };
        let header = quiver_protocol::header::ReplicationMembersRequestHeader {
            action: change.action().to_string(),
            member_id: change.member(),
            address,
            new_member_id,
            timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        };
        let request_code = quiver_protocol::code::request::QUIVER_REPLICATION_MEMBERS;
        let request = quiver_protocol::RemotingCommand::request(request_code, header.to_ext());
        let wait = timeout + MEMBERSHIP_ANSWER_SLACK;
        let admin = Admin::new(Self::config_with(wait, &self.access_for(addr)));
        let response = admin.core().invoke(&addr.0, request).await;
        admin.shutdown().await;
        let response = quiver_client::remoting::expect_success(&addr.0, request_code, response?)?;
        let body: quiver_protocol::body::ReplicationMembers =
            quiver_protocol::body::decode_json(&response.body, "ReplicationMembers").map_err(
                |source| ClientError::Body {
                    addr: addr.0.clone(),
                    request_code,
                    source,
                },
            )?;
        Ok(body.members)
    }

    /// The client for `addr`: with its Broker's access, or unsigned and plain.
    fn admin_for(&self, addr: &BrokerAddr) -> Arc<Admin> {
        let scoped = self.scoped.lock().expect("scoped admins lock poisoned");
        match scoped.get(account_scope(addr)) {
            Some((_, admin)) => admin.clone(),
            None => self.unsigned.clone(),
        }
    }

    async fn consume_stats_of(
        &self,
        addr: &BrokerAddr,
        group: &str,
    ) -> Result<ConsumeStats, AdminError> {
        let request = "GET_CONSUME_STATS";
        let admin = self.admin_for(addr);
        let stats = admin.consume_stats_at(&addr.0, group, None);
        let Some(stats) = answer(addr, request, stats).await? else {
            return Ok(ConsumeStats::default());
        };
        let mut queues = Vec::with_capacity(stats.offset_table.len());
        for (queue, offsets) in stats.offset_table {
            let broker_offset = QueueOffset(u64::try_from(offsets.broker_offset).unwrap_or(0));
            // A negative consumer offset is the broker's "nothing committed".
            let consumer_offset = u64::try_from(offsets.consumer_offset).ok().map(QueueOffset);
            let oldest_unconsumed_store_ms = match consumer_offset {
                Some(committed) if committed < broker_offset => {
                    let stored = admin.store_time_at(&addr.0, group, &queue, committed);
                    answer(addr, "PULL_MESSAGE", stored).await?
                }
                _ => None,
            };
            queues.push(QueueConsumeStats {
                topic: queue.topic,
                broker_name: queue.broker_name,
                queue_id: i32::try_from(queue.queue_id).unwrap_or(i32::MAX),
                broker_offset,
                consumer_offset,
                oldest_unconsumed_store_ms,
            });
        }
        Ok(ConsumeStats { queues })
    }
}

/// The call's answer, its failure in the operator's terms: the broker did not answer
/// (Unreachable), refused (Rejected) or answered something undecodable (Malformed).
async fn answer<T>(
    addr: &BrokerAddr,
    request: &'static str,
    call: impl Future<Output = Result<T, ClientError>>,
) -> Result<T, AdminError> {
    call.await
        .map_err(|error| admin_error(addr, request, error))
}

fn admin_error(addr: &BrokerAddr, request: &'static str, error: ClientError) -> AdminError {
    let addr = addr.clone();
    match error {
        ClientError::Broker { code, remark, .. } => AdminError::Rejected {
            addr,
            request,
            code,
            remark,
        },
        ClientError::BrokerBusy { remark, .. } => AdminError::Rejected {
            addr,
            request,
            code: quiver_protocol::code::response::SYSTEM_BUSY,
            remark,
        },
        error @ (ClientError::Header { .. }
        | ClientError::Body { .. }
        | ClientError::Records { .. }) => AdminError::Malformed {
            addr,
            request,
            source: Box::new(error),
        },
        error => AdminError::Unreachable {
            addr,
            source: Box::new(error),
        },
    }
}

impl BrokerAdmin for RemotingAdmin {
    fn use_access(&self, scope: &str, access: BrokerAccess) {
        let mut scoped = self.scoped.lock().expect("scoped admins lock poisoned");
        if access == BrokerAccess::default() {
            scoped.remove(scope);
            return;
        }
        // A new client only when the access changes: it keeps its connections otherwise.
        if scoped
            .get(scope)
            .is_some_and(|(current, _)| *current == access)
        {
            return;
        }
        let config = Self::config_with(self.call_timeout, &access);
        scoped.insert(scope.to_string(), (access, Arc::new(Admin::new(config))));
    }

    fn consume_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<ConsumeStats, AdminError>> {
        self.consume_stats_of(addr, group).boxed()
    }

    fn topic_stats<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a str,
    ) -> BoxFuture<'a, Result<TopicStats, AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            let call = admin.topic_stats_at(&addr.0, topic);
            let table = answer(addr, "GET_TOPIC_STATS_INFO", call).await?;
            let queues = table
                .offset_table
                .into_iter()
                .map(|(queue, offsets)| QueueTopicStats {
                    broker_name: queue.broker_name,
                    queue_id: i32::try_from(queue.queue_id).unwrap_or(i32::MAX),
                    min_offset: QueueOffset(u64::try_from(offsets.min_offset).unwrap_or(0)),
                    max_offset: QueueOffset(u64::try_from(offsets.max_offset).unwrap_or(0)),
                    last_update_ms: (offsets.last_update_timestamp > 0)
                        .then_some(offsets.last_update_timestamp),
                })
                .collect();
            Ok(TopicStats { queues })
        }
        .boxed()
    }

    fn members<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            let call = admin.members_at(&addr.0, group);
            let connections = answer(addr, "GET_CONSUMER_CONNECTION_LIST", call).await?;
            Ok(connections
                .into_iter()
                .map(|connection| connection.client_id)
                .collect())
        }
        .boxed()
    }

    fn groups<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            answer(
                addr,
                "GET_ALL_SUBSCRIPTIONGROUP_CONFIG",
                admin.groups_at(&addr.0),
            )
            .await
        }
        .boxed()
    }

    fn topics<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<Vec<String>, AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            let call = admin.topics_at(&addr.0);
            let topics = answer(addr, "GET_ALL_TOPIC_CONFIG", call).await?;
            Ok(topics.into_iter().map(|topic| topic.name).collect())
        }
        .boxed()
    }

    fn set_permission<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        permission: BrokerPermission,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            answer(
                addr,
                "UPDATE_BROKER_CONFIG",
                admin.set_broker_permission(&addr.0, permission.wire_value()),
            )
            .await
        }
        .boxed()
    }

    fn create_topic<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        topic: &'a TopicConfig,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let queues = u32::try_from(topic.queues).unwrap_or(1);
            let spec = TopicSpec::new(topic.name.clone(), queues);
            let admin = self.admin_for(addr);
            let call = admin.create_topic_at(&addr.0, &spec);
            answer(addr, "UPDATE_AND_CREATE_TOPIC", call).await
        }
        .boxed()
    }

    fn upsert_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a SubscriptionGroup,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let config = SubscriptionGroupConfig {
                consume_enable: group.consume_enable,
                consume_from_min_enable: group.consume_from_min_enable,
                retry_queue_nums: group.retry_queue_nums,
                retry_max_times: group.max_reconsume_times,
                ..SubscriptionGroupConfig::named(group.group.clone())
            };
            let admin = self.admin_for(addr);
            let call = admin.upsert_group_at(&addr.0, &config);
            answer(addr, "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP", call).await
        }
        .boxed()
    }

    fn reset_offsets<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
        topic: &'a str,
        target: ResetTarget,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            answer(
                addr,
                "INVOKE_BROKER_TO_RESET_OFFSET",
                admin.reset_offsets_at(&addr.0, group, topic, target),
            )
            .await
        }
        .boxed()
    }

    fn delete_group<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        group: &'a str,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            answer(
                addr,
                "DELETE_SUBSCRIPTIONGROUP",
                admin.delete_group_at(&addr.0, group),
            )
            .await
        }
        .boxed()
    }

    fn runtime_info<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<RuntimeInfo, AdminError>> {
        async move {
            // An older broker answers REQUEST_CODE_NOT_SUPPORTED: a Rejected error the caller
            // recognises with `is_unsupported`.
            let admin = self.admin_for(addr);
            let call = admin.runtime_info_at(&addr.0);
            let table = answer(addr, "GET_BROKER_RUNTIME_INFO", call).await?;
            Ok(RuntimeInfo::from_table(&table))
        }
        .boxed()
    }

    fn replication_status<'a>(
        &'a self,
        addr: &'a BrokerAddr,
    ) -> BoxFuture<'a, Result<ReplicationStatus, AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            let call = admin.replication_status_at(&addr.0);
            answer(addr, "QUIVER_REPLICATION_STATUS", call).await
        }
        .boxed()
    }

    fn switchover<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        target: u64,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<(), AdminError>> {
        async move {
            let admin = self.admin_for(addr);
            let call = admin.switchover_at(&addr.0, target, timeout);
            answer(addr, "QUIVER_SWITCHOVER", call).await
        }
        .boxed()
    }

    fn change_membership<'a>(
        &'a self,
        addr: &'a BrokerAddr,
        change: &'a MembershipChange,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<BTreeMap<u64, String>, AdminError>> {
        async move {
            let call = self.membership_call(addr, change, timeout);
            answer(addr, "QUIVER_REPLICATION_MEMBERS", call).await
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quiver_protocol::acl::Credentials;
    use quiver_protocol::body;
    use quiver_protocol::code::{request, response};
    use quiver_protocol::RemotingCommand;
    use quiver_remoting::{Connection, Options};
    use std::collections::BTreeMap;
    use tokio::net::TcpListener;

    /// A broker stand-in on loopback that answers one request with `answer(request)`.
    async fn one_answer(
        answer: impl FnOnce(&RemotingCommand) -> RemotingCommand + Send + 'static,
    ) -> BrokerAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = BrokerAddr(listener.local_addr().expect("addr").to_string());
        tokio::spawn(async move {
            let (stream, peer) = listener.accept().await.expect("accept");
            let (connection, mut incoming) =
                Connection::start(stream, Options::new(peer.to_string()));
            let request = incoming.next().await.expect("a frame").expect("a request");
            connection
                .respond(answer(&request.command))
                .await
                .expect("answered");
            drop(connection);
            incoming.finish().await;
        });
        addr
    }

    #[tokio::test]
    async fn runtime_info_decodes_the_kv_table() {
        let addr = one_answer(|request| {
            assert_eq!(request.code, request::GET_BROKER_RUNTIME_INFO);
            let table = body::KvTable {
                table: BTreeMap::from([
                    ("commitLogDiskRatio".to_string(), "0.93".to_string()),
                    ("quiverDiskHighWaterRatio".to_string(), "0.9".to_string()),
                    ("quiverWritable".to_string(), "false".to_string()),
                    (
                        "quiverWriteRefusal".to_string(),
                        "disk-high-water".to_string(),
                    ),
                ]),
            };
            request
                .response_to(response::SUCCESS, None)
                .with_body(table.encode())
        })
        .await;
        let info = RemotingAdmin::default()
            .runtime_info(&addr)
            .await
            .expect("answered");
        assert_eq!(info.disk_used_ratio, Some(0.93));
        assert_eq!(info.high_water_ratio, Some(0.9));
        assert_eq!(info.writable, Some(false));
        assert_eq!(info.write_refusal.as_deref(), Some("disk-high-water"));
    }

    #[tokio::test]
    async fn an_older_broker_is_recognised_as_unsupported() {
        let addr = one_answer(|request| {
            request.response_to(
                response::REQUEST_CODE_NOT_SUPPORTED,
                Some("request type 28 not supported".to_string()),
            )
        })
        .await;
        let error = RemotingAdmin::default()
            .runtime_info(&addr)
            .await
            .expect_err("refused");
        assert!(error.is_unsupported(), "{error:?}");
    }

    #[tokio::test]
    async fn calls_to_a_brokers_scope_are_signed_with_its_account() {
        let check = |expected: Option<&'static str>| {
            move |request: &RemotingCommand| {
                let access_key = request.ext(quiver_protocol::acl::ACCESS_KEY);
                assert_eq!(access_key, expected);
                if expected.is_some() {
                    assert!(quiver_protocol::acl::verify(request, "operator-secret"));
                }
                request
                    .response_to(response::SUCCESS, None)
                    .with_body(body::KvTable::default().encode())
            }
        };
        let admin = RemotingAdmin::default();
        let signed = one_answer(check(Some("operator1"))).await;
        let access = BrokerAccess {
            account: Some(Credentials::new("operator1", "operator-secret")),
            tls: None,
        };
        admin.use_access(account_scope(&signed), access);
        admin
            .runtime_info(&signed)
            .await
            .expect("signed call answered");
        // Another Broker's brokers, and this one's once its account is dropped: unsigned.
        let other = one_answer(check(None)).await;
        admin
            .runtime_info(&other)
            .await
            .expect("unsigned call answered");
        admin.use_access(account_scope(&signed), BrokerAccess::default());
        let again = one_answer(check(None)).await;
        admin
            .runtime_info(&again)
            .await
            .expect("unsigned call answered");
    }
    #[tokio::test]
    async fn a_membership_change_is_signed_sends_its_header_and_reads_the_membership() {
        let addr = one_answer(|request| {
            assert_eq!(request.code, request::QUIVER_REPLICATION_MEMBERS);
            assert_eq!(
                request.ext(quiver_protocol::acl::ACCESS_KEY),
                Some("operator1")
            );
            assert!(quiver_protocol::acl::verify(request, "operator-secret"));
            assert_eq!(request.ext("action"), Some("add"));
            assert_eq!(request.ext("memberId"), Some("2"));
            assert_eq!(request.ext("address"), Some("qb-2:10911"));
            assert_eq!(request.ext("timeoutMs"), Some("60000"));
            let members = r#"{"members":{"0":"qb-0:10911","1":"qb-1:10911","2":"qb-2:10911"}}"#;
            request
                .response_to(response::SUCCESS, None)
                .with_body(members.as_bytes().to_vec().into())
        })
        .await;
        let admin = RemotingAdmin::default();
        let access = BrokerAccess {
            account: Some(Credentials::new("operator1", "operator-secret")),
            tls: None,
        };
        admin.use_access(account_scope(&addr), access);
        let add = MembershipChange::Add {
            member: 2,
            address: "qb-2:10911".into(),
        };
        let members = admin
            .change_membership(&addr, &add, Duration::from_secs(60))
            .await
            .expect("answered");
        assert_eq!(members.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
        assert_eq!(members[&2], "qb-2:10911");
    }

    #[tokio::test]
    async fn a_refused_membership_change_is_rejected_with_the_remark() {
        let addr = one_answer(|request| {
            assert_eq!(request.ext("action"), Some("remove"));
            request.response_to(
                response::SYSTEM_ERROR,
                Some("replica 2 is the master".to_string()),
            )
        })
        .await;
        let remove = MembershipChange::Remove { member: 2 };
        let error = RemotingAdmin::default()
            .change_membership(&addr, &remove, Duration::from_secs(1))
            .await
            .expect_err("refused");
        let AdminError::Rejected {
            remark, request, ..
        } = error
        else {
            panic!("not a refusal: {error:?}");
        };
        assert_eq!(request, "QUIVER_REPLICATION_MEMBERS");
        assert_eq!(remark, "replica 2 is the master");
    }
}
