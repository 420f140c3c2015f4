//! openraft's network, over the embedding broker's [`Transport`]: each Raft RPC
//! is one `Transport::call` whose body and answer are JSON. The answer is the
//! receiving member's `Result<response, RaftError>` (see `Consensus::handle`).

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

use crate::{Transport, TransportError, TypeConfig};

pub(crate) const KIND_VOTE: &str = "vote";
pub(crate) const KIND_APPEND: &str = "append";
pub(crate) const KIND_SNAPSHOT: &str = "snapshot";
pub(crate) const KIND_PROPOSE: &str = "propose";

/// How long openraft waits before retrying an unreachable member.
const UNREACHABLE_BACKOFF: Duration = Duration::from_millis(200);

pub(crate) struct NetworkFactory {
    pub(crate) transport: Arc<dyn Transport>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = Network;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> Network {
        Network {
            transport: self.transport.clone(),
            target,
            address: node.addr.clone(),
        }
    }
}

pub(crate) struct Network {
    transport: Arc<dyn Transport>,
    target: u64,
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
        let body = serde_json::to_vec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let call = self.transport.call(self.target, &self.address, kind, body);
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
