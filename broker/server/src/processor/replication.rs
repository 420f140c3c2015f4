//! The requests of replicated broker groups: replica fetches, consensus messages, the
//! group's status, planned switchover and membership changes; and GET_ALL_CONSUMER_OFFSET,
//! which replicas copy.

use std::time::Duration;

use quiver_protocol::body::ReplicationMembers;
use quiver_protocol::code::response;
use quiver_protocol::header::{
    ConsensusRequestHeader, ReplicaFetchRequestHeader, ReplicationMembersRequestHeader,
    SwitchoverRequestHeader,
};
use quiver_protocol::RemotingCommand;

use super::{Ctx, Outcome, Refusal};
use crate::replication::{MembersChange, MembersError, Replication};

fn replication(ctx: &Ctx) -> Result<&std::sync::Arc<Replication>, Refusal> {
    ctx.broker.replication().as_ref().ok_or_else(|| {
        Refusal::new(
            response::REQUEST_CODE_NOT_SUPPORTED,
            format!(
                "broker {} is standalone (no --group-members): it has no replication",
                ctx.broker.config().broker_name
            ),
        )
    })
}

pub async fn fetch(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = ReplicaFetchRequestHeader::from_command(req)?;
    let served = replication(ctx)?
        .serve_fetch(ctx.broker.store(), &header)
        .await
        .map_err(|refusal| Refusal::new(response::SERVICE_NOT_AVAILABLE, refusal.to_string()))?;
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_ext_fields(served.header.to_ext())
        .with_body(served.body))
}

pub async fn consensus(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = ConsensusRequestHeader::from_command(req)?;
    let answer = replication(ctx)?
        .handle_consensus(&header, &req.body)
        .await
        .map_err(|refusal| {
            Refusal::new(
                response::SERVICE_NOT_AVAILABLE,
                crate::error::chain(&refusal),
            )
        })?;
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(answer.into()))
}

pub fn status(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let status = replication(ctx)?.status(ctx.broker.store());
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(status.encode()))
}

pub async fn switchover(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = SwitchoverRequestHeader::from_command(req)?;
    let timeout = header.timeout_ms.map_or(
        crate::replication::DEFAULT_SWITCHOVER_TIMEOUT,
        Duration::from_millis,
    );
    let replication = replication(ctx)?;
    let paused = replication
        .switchover(ctx.broker.store(), header.target_replica_id, timeout)
        .await
        .map_err(|error| Refusal::new(response::SYSTEM_ERROR, error.to_string()))?;
    tracing::info!(
        target = header.target_replica_id,
        ?paused,
        "mastership handed over"
    );
    let status = replication.status(ctx.broker.store());
    Ok(req
        .response_to(
            response::SUCCESS,
            Some(format!("sends paused {} ms", paused.as_millis())),
        )
        .with_body(status.encode()))
}

/// QUIVER_REPLICATION_MEMBERS (30005): a membership change, made on the consensus leader
/// (forwarded there from any other member); answers the membership after it.
pub async fn members(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let header = ReplicationMembersRequestHeader::from_command(req)?;
    let replication = replication(ctx)?;
    let refuse =
        |error: MembersError| Refusal::new(response::SYSTEM_ERROR, crate::error::chain(&error));
    let change = MembersChange::parse(&header).map_err(refuse)?;
    let forwarded = replication
        .forward_members_change(&header, req)
        .await
        .map_err(refuse)?;
    if let Some(answer) = forwarded {
        return Ok(req
            .response_to(answer.code, answer.remark)
            .with_body(answer.body));
    }
    let members = replication
        .change_members(ctx.broker.store(), change, header.timeout_ms)
        .await
        .map_err(refuse)?;
    let body = serde_json::to_vec(&ReplicationMembers { members }).map_err(|error| {
        Refusal::new(
            response::SYSTEM_ERROR,
            format!("cannot encode the membership: {error}"),
        )
    })?;
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(body.into()))
}

/// GET_ALL_CONSUMER_OFFSET (43): every committed offset, as Apache's consumerOffset.json.
pub fn all_consumer_offsets(ctx: &Ctx, req: &RemotingCommand) -> Outcome {
    let table = crate::replication::offset_table(ctx.broker.as_ref());
    let body = serde_json::to_vec(&table).map_err(|error| {
        Refusal::new(
            response::SYSTEM_ERROR,
            format!("cannot encode offsets: {error}"),
        )
    })?;
    Ok(req
        .response_to(response::SUCCESS, None)
        .with_body(body.into()))
}
