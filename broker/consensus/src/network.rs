//! openraft's network, over the embedding broker's [`Transport`]: each Raft RPC
//! is one `Transport::call` to the member the target Raft node belongs to, whose
//! body and answer are JSON. The body is openraft's request with one more field,
//! `to_node`: the Raft node id it is meant for, which a member that is not (or not
//! yet) that node refuses (see `Consensus::handle`). The answer is the receiving
//! member's `Result<response, RaftError>`.

use std::sync::Arc;
use std::time::Duration;

use openraft::error::{
    Infallible, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{Backoff, RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::BasicNode;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::{member_of, Transport, TransportError, TypeConfig};

pub(crate) const KIND_VOTE: &str = "vote";
pub(crate) const KIND_APPEND: &str = "append";
pub(crate) const KIND_SNAPSHOT: &str = "snapshot";
pub(crate) const KIND_PROPOSE: &str = "propose";
pub(crate) const KIND_PROBE: &str = "probe";
pub(crate) const KIND_REJOIN: &str = "rejoin";
pub(crate) const KIND_ELECT: &str = "elect";

/// The field of a Raft RPC's body that names the Raft node it is meant for.
const TO_NODE: &str = "to_node";

/// `req`'s JSON with [`TO_NODE`] = `to` added (a member of an older version
/// ignores the unknown field).
pub(crate) fn wrap<T: Serialize>(req: &T, to: u64) -> serde_json::Result<Vec<u8>> {
    let mut value = serde_json::to_value(req)?;
    if let serde_json::Value::Object(fields) = &mut value {
        fields.insert(TO_NODE.to_string(), to.into());
    }
    serde_json::to_vec(&value)
}

/// A Raft RPC's body: the node it is meant for (None from a sender that does not
/// say) and the request.
pub(crate) fn unwrap<T: DeserializeOwned>(body: &[u8]) -> serde_json::Result<(Option<u64>, T)> {
    let mut value: serde_json::Value = serde_json::from_slice(body)?;
    let to = match &mut value {
        serde_json::Value::Object(fields) => fields.remove(TO_NODE).and_then(|v| v.as_u64()),
        _ => None,
    };
    Ok((to, serde_json::from_value(value)?))
}

/// How long openraft waits before retrying an unreachable member.
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(200);

pub(crate) struct NetworkFactory {
    pub(crate) transport: Arc<dyn Transport>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Network;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Network {
        let member = member_of(target);
        Network {
            transport: self.transport.clone(),
            target,
            member,
            // The address the group agreed with the node's membership.
            address: node.addr.clone(),
        }
    }
}

pub(crate) struct Network {
    transport: Arc<dyn Transport>,
    /// The Raft node id.
    target: u64,
    /// The member it belongs to (what the transport knows).
    member: u64,
    address: String,
}

type RpcResult<T, E> = Result<T, RPCError<u64, BasicNode, RaftError<u64, E>>>;

impl Network {
    async fn rpc<Req, Resp, E>(&self, kind: &str, req: &Req, ttl: Duration) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let body = wrap(req, self.target).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let call = self.transport.call(self.member, &self.address, kind, body);
        let answer = match tokio::time::timeout(ttl, call).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) => return Err(RPCError::Unreachable(Unreachable::new(&e))),
            Err(_) => {
                let e =
                    TransportError(format!("{kind} to {} timed out after {ttl:?}", self.target));
                return Err(RPCError::Unreachable(Unreachable::new(&e)));
            }
        };
        let result: Result<Resp, RaftError<u64, E>> = serde_json::from_slice(&answer)
            .map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        result.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Network {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>, Infallible> {
        self.rpc(KIND_APPEND, &rpc, option.hard_ttl()).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        self.rpc(KIND_SNAPSHOT, &rpc, option.hard_ttl()).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>, Infallible> {
        self.rpc(KIND_VOTE, &rpc, option.hard_ttl()).await
    }

    fn backoff(&self) -> Backoff {
        Backoff::new(std::iter::repeat(UNREACHABLE_BACKOFF))
    }
}
