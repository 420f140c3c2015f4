//! The calls of replicated broker groups, addressed to one member: the group's status as that
//! member sees it (QUIVER_REPLICATION_STATUS), a switchover of mastership (QUIVER_SWITCHOVER)
//! and a membership change (QUIVER_REPLICATION_MEMBERS).

use std::collections::BTreeMap;
use std::time::Duration;

use quiver_protocol::body::{ReplicaRole, ReplicaStatus, ReplicationMembers, ReplicationStatus};
use quiver_protocol::header as h;
use quiver_protocol::{code, ExtFields, RemotingCommand};

use super::per_broker::decoded;
use super::Admin;
use crate::error::Result;

/// Time the switchover's answer may take beyond what the master may wait for the target.
const SWITCHOVER_ANSWER_SLACK: Duration = Duration::from_secs(5);

/// A change of a group's membership (QUIVER_REPLICATION_MEMBERS).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MembershipChange {
    /// Add member `id` at `address` (started with an empty data directory and a
    /// `--group-members` list naming it); answered once it is a voter of the consensus.
    Add { id: u64, address: String },
    /// Remove member `id` (mastership is moved away from it first).
    Remove { id: u64 },
    /// Add `new` at `address`, then remove `old`.
    Replace { old: u64, new: u64, address: String },
}

impl MembershipChange {
    fn header(&self, timeout: Duration) -> h::ReplicationMembersRequestHeader {
        let (action, member_id, address, new_member_id) = match self {
            MembershipChange::Add { id, address } => ("add", *id, Some(address.clone()), None),
            MembershipChange::Remove { id } => ("remove", *id, None, None),
            MembershipChange::Replace { old, new, address } => {
                ("replace", *old, Some(address.clone()), Some(*new))
            }
        };
        h::ReplicationMembersRequestHeader {
            action: action.to_owned(),
            member_id,
            address,
            new_member_id,
            timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        }
    }
}

impl Admin {
    /// Asks the member at `addr` (any member: it forwards to the group's consensus leader)
    /// to make `change`, taking at most `timeout`; returns the membership after it, member
    /// id -> remoting address. A refusal (too few members left, not a member, the new member
    /// never asked to join) is [`crate::ClientError::Broker`] with the broker's remark.
    pub async fn replication_members_at(
        &self,
        addr: &str,
        change: &MembershipChange,
        timeout: Duration,
    ) -> Result<BTreeMap<u64, String>> {
        let request_code = code::request::QUIVER_REPLICATION_MEMBERS;
        let request = RemotingCommand::request(request_code, change.header(timeout).to_ext());
        // Answered once the change is agreed (a new member caught up): wait for that, plus
        // a forward to the leader.
        let wait = timeout + SWITCHOVER_ANSWER_SLACK * 2;
        let response = self.core.remoting.invoke(addr, request, wait).await?;
        let response = crate::remoting::expect_success(addr, request_code, response)?;
        let decode = |body: &[u8]| {
            serde_json::from_slice::<ReplicationMembers>(body).map_err(|source| {
                quiver_protocol::BodyError::Json {
                    what: "ReplicationMembers",
                    source,
                }
            })
        };
        Ok(decoded(addr, request_code, decode, &response)?.members)
    }

    /// The broker group of `addr` as that member sees it. A broker from before replicated
    /// groups refuses with REQUEST_CODE_NOT_SUPPORTED ([`crate::ClientError::is_unsupported`]);
    /// [`standalone_status`] is what such a broker is.
    pub async fn replication_status_at(&self, addr: &str) -> Result<ReplicationStatus> {
        let request_code = code::request::QUIVER_REPLICATION_STATUS;
        let request = RemotingCommand::request(request_code, ExtFields::default());
        let response = self.call_ok(addr, request).await?;
        decoded(addr, request_code, ReplicationStatus::decode, &response)
    }

    /// Asks the master at `addr` to hand mastership to `target_replica_id`, pausing sends at
    /// most `timeout` while the target catches up. Ok once the target is master; a refusal
    /// (not the master, target not in sync, timed out) is [`crate::ClientError::Broker`] with
    /// the broker's remark.
    pub async fn switchover_at(
        &self,
        addr: &str,
        target_replica_id: u64,
        timeout: Duration,
    ) -> Result<()> {
        let header = h::SwitchoverRequestHeader {
            target_replica_id,
            timeout_ms: Some(u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)),
        };
        let request_code = code::request::QUIVER_SWITCHOVER;
        let request = RemotingCommand::request(request_code, header.to_ext());
        // The master answers only once the target is master: wait for that, not the usual
        // request timeout.
        let wait = timeout + SWITCHOVER_ANSWER_SLACK;
        let response = self.core.remoting.invoke(addr, request, wait).await?;
        crate::remoting::expect_success(addr, request_code, response).map(|_| ())
    }
}

/// What a broker without replication is: the master of a group of one, always in sync.
pub fn standalone_status(broker_name: &str, addr: &str) -> ReplicationStatus {
    ReplicationStatus {
        broker_name: broker_name.to_owned(),
        replica_id: 0,
        mode: "async".to_owned(),
        min_in_sync_replicas: 1,
        epoch: 0,
        master_id: Some(0),
        master_address: Some(addr.to_owned()),
        in_sync_replicas: vec![0],
        confirmed_offset: 0,
        writable: true,
        replicas: vec![ReplicaStatus {
            replica_id: 0,
            address: addr.to_owned(),
            role: ReplicaRole::Master,
            in_sync: true,
            log_end: 0,
            lag_bytes: 0,
            lag_ms: 0,
        }],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::ClientConfig;
    use quiver_protocol::code::{request, response};
    use quiver_remoting::{Connection, Options};
    use tokio::net::TcpListener;

    /// A broker stand-in on loopback answering one request with `answer(request)`.
    async fn one_answer(
        answer: impl FnOnce(&RemotingCommand) -> RemotingCommand + Send + 'static,
    ) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr").to_string();
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

    fn admin() -> Admin {
        Admin::new(ClientConfig::new(""))
    }

    #[tokio::test]
    async fn replication_status_decodes_the_body() {
        let mut status = standalone_status("qb-0", "10.0.0.1:10911");
        status.epoch = 7;
        let sent = status.clone();
        let addr = one_answer(move |command| {
            assert_eq!(command.code, request::QUIVER_REPLICATION_STATUS);
            command
                .response_to(response::SUCCESS, None)
                .with_body(sent.encode())
        })
        .await;
        let got = admin().replication_status_at(&addr).await.expect("status");
        assert_eq!(got, status);
    }

    #[tokio::test]
    async fn an_older_broker_refuses_the_status_as_unsupported() {
        let addr = one_answer(|command| {
            command.response_to(
                response::REQUEST_CODE_NOT_SUPPORTED,
                Some("request type 30003 not supported".to_owned()),
            )
        })
        .await;
        let error = admin()
            .replication_status_at(&addr)
            .await
            .expect_err("refused");
        assert!(error.is_unsupported(), "{error:?}");
    }

    #[tokio::test]
    async fn switchover_sends_the_target_and_timeout_and_reports_a_refusal() {
        let addr = one_answer(|command| {
            assert_eq!(command.code, request::QUIVER_SWITCHOVER);
            let header = h::SwitchoverRequestHeader::from_ext(&command.ext_fields).expect("header");
            assert_eq!(header.target_replica_id, 2);
            assert_eq!(header.timeout_ms, Some(3000));
            command.response_to(
                response::SYSTEM_ERROR,
                Some("replica 2 is not in sync".into()),
            )
        })
        .await;
        let error = admin()
            .switchover_at(&addr, 2, Duration::from_secs(3))
            .await
            .expect_err("refused");
        assert!(
            error.to_string().contains("replica 2 is not in sync"),
            "{error}"
        );
        let addr = one_answer(|command| command.response_to(response::SUCCESS, None)).await;
        admin()
            .switchover_at(&addr, 1, Duration::from_secs(3))
            .await
            .expect("switched");
    }

    #[tokio::test]
    async fn a_membership_change_sends_the_header_and_returns_the_new_members() {
        let addr = one_answer(|command| {
            assert_eq!(command.code, request::QUIVER_REPLICATION_MEMBERS);
            let header =
                h::ReplicationMembersRequestHeader::from_ext(&command.ext_fields).expect("header");
            assert_eq!(header.action, "replace");
            assert_eq!(header.member_id, 2);
            assert_eq!(header.new_member_id, Some(4));
            assert_eq!(header.address.as_deref(), Some("h:4"));
            assert_eq!(header.timeout_ms, Some(7000));
            command
                .response_to(response::SUCCESS, None)
                .with_body(r#"{"members":{"0":"h:0","4":"h:4"}}"#.as_bytes().to_vec().into())
        })
        .await;
        let change = MembershipChange::Replace {
            old: 2,
            new: 4,
            address: "h:4".into(),
        };
        let members = admin()
            .replication_members_at(&addr, &change, Duration::from_secs(7))
            .await
            .expect("changed");
        assert_eq!(
            members,
            BTreeMap::from([(0, "h:0".to_owned()), (4, "h:4".to_owned())])
        );
        let addr = one_answer(|command| {
            command.response_to(
                response::SYSTEM_ERROR,
                Some("removing member 1 would leave 1 member(s)".into()),
            )
        })
        .await;
        let error = admin()
            .replication_members_at(
                &addr,
                &MembershipChange::Remove { id: 1 },
                Duration::from_secs(1),
            )
            .await
            .expect_err("refused");
        assert!(
            error.to_string().contains("would leave 1 member"),
            "{error}"
        );
    }
}
