//! The calls of replicated broker groups, addressed to one member: the group's status as that
//! member sees it (QUIVER_REPLICATION_STATUS) and a switchover of mastership (QUIVER_SWITCHOVER).

use std::time::Duration;

use quiver_protocol::body::{ReplicaRole, ReplicaStatus, ReplicationStatus};
use quiver_protocol::header as h;
use quiver_protocol::{code, ExtFields, RemotingCommand};

use super::per_broker::decoded;
use super::Admin;
use crate::error::Result;

/// Time the switchover's answer may take beyond what the master may wait for the target.
const SWITCHOVER_ANSWER_SLACK: Duration = Duration::from_secs(5);

impl Admin {
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
}
