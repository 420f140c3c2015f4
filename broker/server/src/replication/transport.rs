//! The group's consensus messages over the remoting port (QUIVER_CONSENSUS), both ways.

use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use quiver_consensus::{
    BoxFuture, Consensus, ConsensusConfig, ConsensusError, Transport, TransportError,
};
use quiver_protocol::code::{request, response};
use quiver_protocol::header::ConsensusRequestHeader;
use quiver_protocol::RemotingCommand;

use super::controller::ReportBody;
use super::Replication;

/// A consensus message not answered in this long failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

struct RemotingTransport {
    replication: Weak<Replication>,
}

impl Transport for RemotingTransport {
    fn call(
        &self,
        _target: u64,
        address: &str,
        kind: &str,
        body: Vec<u8>,
    ) -> BoxFuture<'static, Result<Vec<u8>, TransportError>> {
        let replication = self.replication.clone();
        let address = address.to_owned();
        let kind = kind.to_owned();
        Box::pin(async move {
            let replication = replication
                .upgrade()
                .ok_or_else(|| TransportError("the broker is stopping".into()))?;
            let header = ConsensusRequestHeader {
                broker_name: replication.broker_name.clone(),
                kind,
                from: replication.id,
            };
            let request = RemotingCommand::request(request::QUIVER_CONSENSUS, header.to_ext())
                .with_body(Bytes::from(body));
            let answer = replication
                .links
                .request(&address, request, CALL_TIMEOUT)
                .await
                .map_err(|error| TransportError(crate::error::chain(&error)))?;
            if answer.code != response::SUCCESS {
                return Err(TransportError(format!(
                    "member {address} refused: {}",
                    answer.remark.unwrap_or_default()
                )));
            }
            Ok(answer.body.to_vec())
        })
    }
}

/// Starts this member's consensus node under `dir`.
pub(super) async fn start_consensus(
    replication: &Arc<Replication>,
    dir: PathBuf,
) -> Result<Consensus, ConsensusError> {
    let transport = Arc::new(RemotingTransport {
        replication: Arc::downgrade(replication),
    });
    let config = ConsensusConfig::new(replication.id, (*replication.members).clone(), dir);
    Consensus::start(config, transport).await
}

/// Why a consensus message from a member was not taken.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConsensusRefusal {
    #[error("member {from} of broker {found} sent to broker {expected}")]
    WrongGroup {
        expected: String,
        found: String,
        from: u64,
    },
    #[error("this member's consensus has not started yet")]
    NotStarted,
    #[error("this member does not lead the group's consensus")]
    NotLeader,
    #[error("unreadable report: {0}")]
    Report(#[from] serde_json::Error),
    #[error(transparent)]
    Consensus(#[from] ConsensusError),
}

impl Replication {
    /// Answers one QUIVER_CONSENSUS message: a member's report (on the leader), or a message
    /// of the consensus itself.
    pub(crate) async fn handle_consensus(
        &self,
        header: &ConsensusRequestHeader,
        body: &[u8],
    ) -> Result<Vec<u8>, ConsensusRefusal> {
        if header.broker_name != self.broker_name {
            return Err(ConsensusRefusal::WrongGroup {
                expected: self.broker_name.clone(),
                found: header.broker_name.clone(),
                from: header.from,
            });
        }
        let consensus = self.consensus().ok_or(ConsensusRefusal::NotStarted)?;
        if header.kind == "report" {
            if !consensus.is_leader() {
                return Err(ConsensusRefusal::NotLeader);
            }
            self.record_report(serde_json::from_slice::<ReportBody>(body)?);
            let answer = self.report_answer().ok_or(ConsensusRefusal::NotLeader)?;
            return Ok(serde_json::to_vec(&answer)?);
        }
        Ok(consensus.handle(&header.kind, body).await?)
    }
}
