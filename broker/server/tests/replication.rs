//! Replicated broker groups, three members in this process: election, mirroring, the
//! in-sync minimum, failover, switchover and routes.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{ext, test_config, wait_for, Client, TestBroker};
use quiver_broker::ReplicationMode;
use quiver_protocol::body::{ReplicationStatus, TopicRouteData};
use quiver_protocol::code::{request, response};
use tokio::net::TcpListener;

const MEMBERS: usize = 3;

struct Group {
    members: Vec<Option<TestBroker>>,
    addrs: Vec<std::net::SocketAddr>,
    _dirs: Vec<tempfile::TempDir>,
}

async fn start_group(mode: ReplicationMode, min_in_sync: u32) -> Group {
    let mut listeners = Vec::new();
    for _ in 0..MEMBERS {
        let remoting = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let http = TcpListener::bind("127.0.0.1:0").await.unwrap();
        listeners.push((remoting, http));
    }
    let addrs: Vec<_> = listeners
        .iter()
        .map(|(l, _)| l.local_addr().unwrap())
        .collect();
    let group_members: Vec<String> = addrs
        .iter()
        .enumerate()
        .map(|(id, addr)| format!("{id}={addr}"))
        .collect();
    let dirs: Vec<_> = (0..MEMBERS).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut members = Vec::new();
    for (id, (remoting, http)) in listeners.into_iter().enumerate() {
        let mut config = test_config(dirs[id].path());
        config.broker_name = "group-a".into();
        config.listen = addrs[id].to_string();
        config.http_listen = http.local_addr().unwrap().to_string();
        config.advertise = Some(addrs[id].to_string());
        config.group_members = group_members.clone();
        config.replica_id = id as u64;
        config.replication = mode;
        config.min_in_sync_replicas = min_in_sync;
        config.master_timeout_ms = 1_000;
        config.replica_lag_max_ms = 1_000;
        config.replication_timeout_ms = 3_000;
        members.push(TestBroker::start_on(config, remoting, http).await);
    }
    Group {
        members: members.into_iter().map(Some).collect(),
        addrs,
        _dirs: dirs,
    }
}

async fn status(addr: std::net::SocketAddr) -> Option<ReplicationStatus> {
    let mut client = tokio::time::timeout(Duration::from_secs(2), Client::connect(addr))
        .await
        .ok()?;
    let answer = client
        .call(request::QUIVER_REPLICATION_STATUS, ext(&[]), Bytes::new())
        .await;
    (answer.code == response::SUCCESS).then(|| ReplicationStatus::decode(&answer.body).unwrap())
}

impl Group {
    /// The writable master's id, as the live members agree on it.
    async fn wait_master(&self, other_than: Option<u64>) -> u64 {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            for (id, member) in self.members.iter().enumerate() {
                if member.is_none() || Some(id as u64) == other_than {
                    continue;
                }
                if let Some(status) = status(self.addrs[id]).await {
                    if status.master_id == Some(id as u64) && status.writable {
                        return id as u64;
                    }
                }
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no writable master in time"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn client(&self, id: u64) -> Client {
        Client::connect(self.addrs[id as usize]).await
    }

    async fn stop(&mut self, id: u64) {
        self.members[id as usize].take().unwrap().stop().await;
    }

    async fn stop_all(mut self) {
        for member in self.members.iter_mut() {
            if let Some(member) = member.take() {
                member.stop().await;
            }
        }
    }
}

async fn send_n(client: &mut Client, from: usize, count: usize) {
    for i in from..from + count {
        let answer = client.send("Orders", 0, &format!("m{i}"), "t").await;
        assert_eq!(
            answer.code,
            response::SUCCESS,
            "send {i}: {:?}",
            answer.remark
        );
    }
}

/// Every body in queue 0 of Orders on `addr`, from offset 0.
async fn bodies(addr: std::net::SocketAddr) -> Vec<String> {
    let mut client = Client::connect(addr).await;
    let mut all = Vec::new();
    loop {
        let answer = client
            .pull("G", "Orders", 0, all.len() as u64, 0, None)
            .await;
        if answer.code != response::SUCCESS {
            return all;
        }
        let got = common::pulled_bodies(&answer);
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_elects_a_master_and_every_member_holds_what_it_acknowledged() {
    let group = start_group(ReplicationMode::Sync, 2).await;
    let master = group.wait_master(None).await;
    let mut client = group.client(master).await;
    send_n(&mut client, 0, 40).await;
    let expected: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    for id in 0..MEMBERS {
        let addr = group.addrs[id];
        let expected = &expected;
        wait_for(
            "the member to hold every acknowledged message",
            Duration::from_secs(10),
            || async move { bodies(addr).await == *expected },
        )
        .await;
    }
    let status = status(group.addrs[master as usize]).await.unwrap();
    assert_eq!(status.in_sync_replicas.len(), MEMBERS, "{status:?}");
    assert!(status.confirmed_offset > 0);
    assert!(status
        .replicas
        .iter()
        .all(|r| r.lag_bytes == 0 || !r.in_sync));
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_refuse_sends_and_routes_name_the_master_first() {
    let group = start_group(ReplicationMode::Async, 1).await;
    let master = group.wait_master(None).await;
    let replica = (master + 1) % MEMBERS as u64;
    let mut client = group.client(replica).await;
    let refused = client.send("Orders", 0, "to-a-replica", "t").await;
    assert_eq!(refused.code, response::SERVICE_NOT_AVAILABLE);
    let remark = refused.remark.clone().unwrap_or_default();
    assert!(remark.contains("replica"), "{remark}");
    assert!(
        remark.contains(&group.addrs[master as usize].to_string()),
        "{remark}"
    );

    let mut on_master = group.client(master).await;
    send_n(&mut on_master, 0, 1).await;
    let answer = client
        .call(
            request::GET_ROUTEINFO_BY_TOPIC,
            ext(&[("topic", "Orders")]),
            Bytes::new(),
        )
        .await;
    assert_eq!(answer.code, response::SUCCESS);
    let route = TopicRouteData::decode(&answer.body).unwrap();
    let addrs = &route.broker_datas[0].broker_addrs;
    assert_eq!(
        addrs.get(&0),
        Some(&group.addrs[master as usize].to_string())
    );
    assert_eq!(addrs.len(), MEMBERS, "{addrs:?}");

    // A group's offset a replica has not copied is the master's to deny: a replica's "none"
    // (or Apache's 0 for a young queue) would start the group's queue over.
    let query = ext(&[
        ("consumerGroup", "never-committed"),
        ("topic", "Orders"),
        ("queueId", "0"),
    ]);
    let on_replica = client
        .call(request::QUERY_CONSUMER_OFFSET, query.clone(), Bytes::new())
        .await;
    assert_eq!(
        on_replica.code,
        response::SYSTEM_BUSY,
        "{:?}",
        on_replica.remark
    );
    assert!(on_replica
        .remark
        .unwrap_or_default()
        .contains("ask the master"));
    let on_master_answer = on_master
        .call(request::QUERY_CONSUMER_OFFSET, query, Bytes::new())
        .await;
    assert_ne!(on_master_answer.code, response::SYSTEM_BUSY);
    group.stop_all().await;
}

/// Sends until one is refused at admission (SERVICE_NOT_AVAILABLE) with a remark
/// containing `expected`; returns that remark. With fewer members than the minimum able to
/// hold them, none is ever acknowledged: a send admitted before the in-sync set shrank is
/// answered SLAVE_NOT_AVAILABLE or FLUSH_SLAVE_TIMEOUT (stored on the master only).
async fn send_until_refused(client: &mut Client, expected: &str) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let answer = client.send("Orders", 0, "unsafe", "t").await;
        let remark = answer.remark.clone().unwrap_or_default();
        assert_ne!(
            answer.code,
            response::SUCCESS,
            "acknowledged with fewer holders than the minimum"
        );
        if answer.code == response::SERVICE_NOT_AVAILABLE && remark.contains(expected) {
            return remark;
        }
        assert!(
            [
                response::SLAVE_NOT_AVAILABLE,
                response::FLUSH_SLAVE_TIMEOUT,
                response::SERVICE_NOT_AVAILABLE
            ]
            .contains(&answer.code),
            "{answer:?}"
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "sends still taken: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sends_are_refused_below_the_in_sync_minimum_and_without_a_quorum() {
    let mut group = start_group(ReplicationMode::Sync, 3).await;
    let master = group.wait_master(None).await;
    let mut client = group.client(master).await;
    send_n(&mut client, 0, 5).await;
    let replicas: Vec<u64> = (0..MEMBERS as u64).filter(|id| *id != master).collect();
    // One replica gone: the other two still agree the smaller in-sync set, below 3.
    group.stop(replicas[0]).await;
    let remark = send_until_refused(&mut client, "min-in-sync-replicas").await;
    assert!(
        remark.contains("2 member(s) in sync, fewer than min-in-sync-replicas 3"),
        "{remark}"
    );
    // Both gone: the master cannot reach a quorum of its group and stops taking writes.
    group.stop(replicas[1]).await;
    send_until_refused(&mut client, "lost contact with its group").await;
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stopped_master_is_replaced_and_nothing_acknowledged_is_lost() {
    let mut group = start_group(ReplicationMode::Sync, 2).await;
    let old = group.wait_master(None).await;
    let mut client = group.client(old).await;
    send_n(&mut client, 0, 30).await;
    let epoch = status(group.addrs[old as usize]).await.unwrap().epoch;
    drop(client);
    group.stop(old).await;
    let new = group.wait_master(Some(old)).await;
    let after = status(group.addrs[new as usize]).await.unwrap();
    assert!(after.epoch > epoch, "{after:?}");
    let mut client = group.client(new).await;
    send_n(&mut client, 30, 10).await;
    let expected: Vec<String> = (0..40).map(|i| format!("m{i}")).collect();
    assert_eq!(bodies(group.addrs[new as usize]).await, expected);
    group.stop_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn switchover_hands_mastership_to_the_named_replica() {
    let group = start_group(ReplicationMode::Sync, 2).await;
    let old = group.wait_master(None).await;
    let target = (old + 1) % MEMBERS as u64;
    let mut client = group.client(old).await;
    send_n(&mut client, 0, 20).await;
    let old_addr = group.addrs[old as usize];
    wait_for(
        "the target in sync",
        Duration::from_secs(10),
        || async move {
            status(old_addr)
                .await
                .is_some_and(|s| s.in_sync_replicas.contains(&target))
        },
    )
    .await;
    let answer = client
        .call(
            request::QUIVER_SWITCHOVER,
            ext(&[
                ("targetReplicaId", &target.to_string()),
                ("timeoutMs", "1000"),
            ]),
            Bytes::new(),
        )
        .await;
    assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
    assert_eq!(group.wait_master(None).await, target);
    let refused = client.send("Orders", 0, "to-the-old-master", "t").await;
    assert_ne!(refused.code, response::SUCCESS);
    let mut on_new = group.client(target).await;
    send_n(&mut on_new, 20, 5).await;
    let expected: Vec<String> = (0..25).map(|i| format!("m{i}")).collect();
    let expected = &expected;
    wait_for(
        "the old master to follow the new one",
        Duration::from_secs(10),
        || async move { bodies(old_addr).await == *expected },
    )
    .await;
    group.stop_all().await;
}

/// A raw pull of queue 0 of Orders at `offset`, naming the epoch the reader last pulled in.
async fn pull_in_epoch(client: &mut Client, offset: u64, epoch: u64) -> (i32, u64, Option<u64>) {
    let fields = ext(&[
        ("consumerGroup", "G"),
        ("topic", "Orders"),
        ("queueId", "0"),
        ("queueOffset", &offset.to_string()),
        ("maxMsgNums", "32"),
        ("sysFlag", "0"),
        ("commitOffset", "-1"),
        ("suspendTimeoutMillis", "0"),
        ("subscription", "*"),
        ("subVersion", "0"),
        ("quiverEpoch", &epoch.to_string()),
    ]);
    let answer = client
        .call(request::PULL_MESSAGE, fields, Bytes::new())
        .await;
    let field = |name: &str| {
        answer
            .ext_fields
            .get(name)
            .and_then(|v| v.parse::<u64>().ok())
    };
    (
        answer.code,
        field("nextBeginOffset").unwrap_or(u64::MAX),
        field("quiverEpoch"),
    )
}

/// Kafka's KIP-320 for Quiver's own clients: a reader that names the epoch it last pulled in
/// and stands past where that epoch's data ends (as after a failover cut the tail it read)
/// is moved back there; within the epoch's data, or in the current epoch, it reads on.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_reader_past_its_epochs_end_is_moved_back_there() {
    let group = start_group(ReplicationMode::Sync, 2).await;
    let old = group.wait_master(None).await;
    let target = (old + 1) % MEMBERS as u64;
    let mut client = group.client(old).await;
    send_n(&mut client, 0, 20).await;
    let old_addr = group.addrs[old as usize];
    wait_for(
        "the target in sync",
        Duration::from_secs(10),
        || async move {
            status(old_addr)
                .await
                .is_some_and(|s| s.in_sync_replicas.contains(&target))
        },
    )
    .await;
    let first_epoch = status(old_addr).await.unwrap().epoch;
    let (code, _, named) = pull_in_epoch(&mut client, 0, first_epoch).await;
    assert_eq!(code, response::SUCCESS);
    assert_eq!(named, Some(first_epoch), "the answer names the epoch");
    let answer = client
        .call(
            request::QUIVER_SWITCHOVER,
            ext(&[
                ("targetReplicaId", &target.to_string()),
                ("timeoutMs", "1000"),
            ]),
            Bytes::new(),
        )
        .await;
    assert_eq!(answer.code, response::SUCCESS, "{:?}", answer.remark);
    assert_eq!(group.wait_master(None).await, target);
    let mut on_new = group.client(target).await;
    send_n(&mut on_new, 20, 5).await;
    let new_epoch = status(group.addrs[target as usize]).await.unwrap().epoch;
    assert!(new_epoch > first_epoch);

    // The first epoch's data of queue 0 ends at offset 20 (m0..m19).
    let (code, next, named) = pull_in_epoch(&mut on_new, 22, first_epoch).await;
    assert_eq!(code, response::PULL_OFFSET_MOVED);
    assert_eq!(next, 20);
    assert_eq!(named, Some(new_epoch));
    let (code, _, _) = pull_in_epoch(&mut on_new, 20, first_epoch).await;
    assert_eq!(code, response::SUCCESS, "at the epoch's end it reads on");
    let (code, _, _) = pull_in_epoch(&mut on_new, 22, new_epoch).await;
    assert_eq!(
        code,
        response::SUCCESS,
        "a reader of the current epoch reads on"
    );
    group.stop_all().await;
}
