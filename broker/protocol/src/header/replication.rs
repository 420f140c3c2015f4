//! Headers of Quiver's replicated broker groups (request codes 30001-30005).

use super::{CommandHeader, FieldKind, Optional, Required};
use crate::error::HeaderError;
use crate::{ExtFields, RemotingCommand};

header! {
    /// QUIVER_REPLICA_FETCH (30001), replica -> master: CommitLog bytes from `offset`. The
    /// replica holds every byte below `heldOffset` (below `offset` when it is absent), so
    /// the request also acknowledges them. Fetches of a stream (`stream`, `seq`) are served
    /// in `seq` order, each from where the previous one ended, so several can be in flight:
    /// `seq` 0 opens a stream at `offset` and its answer names the stream.
    pub struct ReplicaFetchRequestHeader {
        /// The group's broker name, checked so a misconfigured replica is refused.
        req broker_name: String = "brokerName",
        req replica_id: u64 = "replicaId",
        /// The epoch the replica believes current; a master of another epoch refuses.
        req epoch: u64 = "epoch",
        req offset: u64 = "offset",
        req max_bytes: u32 = "maxBytes",
        /// How long the master may hold the request when it has nothing new.
        req max_wait_ms: u64 = "maxWaitMs",
        /// The replica's data-directory incarnation: another one than the master knew is
        /// a member whose disk was replaced, out of sync until it catches up.
        opt incarnation: Option<u64> = "incarnation",
        /// The replica recovered from an unclean stop and has not caught up since.
        opt unclean: Option<bool> = "unclean",
        /// What the replica has appended: every byte below it (defaults to `offset`).
        opt held: Option<u64> = "heldOffset",
        /// The stream a `seq` above 0 belongs to, as the master named it.
        opt stream: Option<u64> = "stream",
        /// The fetch's place in its stream; 0 opens a stream.
        opt seq: Option<u64> = "seq",
    }
}

header! {
    /// The answer to QUIVER_REPLICA_FETCH; the body is the CommitLog bytes from `offset`.
    pub struct ReplicaFetchResponseHeader {
        req epoch: u64 = "epoch",
        req offset: u64 = "offset",
        /// The master's CommitLog end when it answered.
        req master_end: u64 = "masterEnd",
        /// CommitLog bytes below this are held by every in-sync replica: readable.
        req confirmed: u64 = "confirmed",
        /// The master's segment size: a replica's must match to mirror the log.
        req segment_size: u64 = "segmentSize",
        /// The master's oldest retained CommitLog offset (its oldest segment's base). Past
        /// `offset` (the bytes asked for were deleted by retention), the body is empty and
        /// the replica rebuilds from here.
        opt oldest: Option<u64> = "oldestOffset",
        /// The stream this fetch belongs to (a master that serves streams names it).
        opt stream: Option<u64> = "stream",
    }
}

header! {
    /// QUIVER_CONSENSUS (30002): one consensus message; the body is its JSON.
    pub struct ConsensusRequestHeader {
        req broker_name: String = "brokerName",
        /// Which message: `vote`, `append`, `snapshot`, `propose`, `report`.
        req kind: String = "kind",
        req from: u64 = "from",
    }
}

header! {
    /// QUIVER_SWITCHOVER (30004), admin -> master: move mastership to `targetReplicaId`.
    pub struct SwitchoverRequestHeader {
        req target_replica_id: u64 = "targetReplicaId",
        /// How long the master may pause sends waiting for the target to catch up.
        opt timeout_ms: Option<u64> = "timeoutMs",
    }
}

header! {
    /// QUIVER_REPLICATION_MEMBERS (30005), admin -> any member: change the group's membership.
    /// `action` is `add` (`memberId` at `address`), `remove` (`memberId`) or `replace`
    /// (`memberId` by a new member `newMemberId` at `address`). The answer's body is the
    /// membership after the change, JSON `{"members":{"id":"address",...}}`.
    pub struct ReplicationMembersRequestHeader {
        req action: String = "action",
        req member_id: u64 = "memberId",
        opt address: Option<String> = "address",
        opt new_member_id: Option<u64> = "newMemberId",
        /// How long the change may take (catching a new member up included).
        opt timeout_ms: Option<u64> = "timeoutMs",
    }
}
