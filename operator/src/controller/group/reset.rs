//! `spec.offsetReset`, applied exactly once per id on each broker, and the status a pass writes
//! over the stored one (the reset's record is this path's alone).
//!
//! Each broker's reset call is recorded before it is made (`status.offsetResetInProgress`, a
//! status write from a fresh read): the broker, and a digest of the group's committed offsets on
//! it. A later pass finding that record goes on from it instead of starting over: brokers
//! recorded as applied are skipped, so a failed status write never applies a reset twice. The
//! broker whose call was in flight is the one unknown: if this operator saw the call succeed (it
//! remembers, for the status write that failed) it counts as applied; else (the operator stopped
//! between the call and its record) the call is made again only while the broker's committed
//! offsets still match the digest. Unchanged offsets mean either the call never ran or it moved
//! nothing, and making it again moves the group to the same offsets; changed offsets mean the
//! reset ran or consumers moved on since, and a second call could rewind consumers that moved
//! past the reset, so it is not made: the broker is reported (`unconfirmedOn`, a Warning event)
//! for the user to ask again with a new id.

use super::*;
use crate::crd::{OffsetResetProgress, OffsetResetSpec, ResetAttempt};

/// The condition types a pass decides: one it no longer sets is removed.
pub(super) const CONDITIONS: [&str; 5] =
    ["Ready", "Lagging", "Consuming", "Stalled", QUEUES_STALLED];

/// The status a pass writes over the `stored` one: every field as the pass computed it
/// (`ours`) but the conditions of other writers, kept ([`conditions::rebase`]), and the reset's
/// record, which only the reset path writes, kept as stored.
pub(super) fn onto_stored(
    ours: &ConsumerGroupStatus,
    stored: Option<&ConsumerGroupStatus>,
    now: Timestamp,
) -> ConsumerGroupStatus {
    let stored_conditions = stored.map(|status| status.conditions.as_slice());
    let decides = |type_: &str| {
        CONDITIONS.contains(&type_) || conditions::find(&ours.conditions, type_).is_some()
    };
    ConsumerGroupStatus {
        conditions: conditions::rebase(
            stored_conditions.unwrap_or_default(),
            &ours.conditions,
            decides,
            now,
        ),
        applied_offset_reset: stored.and_then(|status| status.applied_offset_reset.clone()),
        offset_reset_in_progress: stored.and_then(|status| status.offset_reset_in_progress.clone()),
        ..ours.clone()
    }
}

/// Applies `spec.offsetReset` once per id, on every broker (waiting while one does not answer:
/// half-applied, it would look done); the record of the last reset applied.
pub(super) async fn apply_offset_reset(
    group: &ConsumerGroup,
    addresses: &[BrokerAddr],
    unanswered: &Unanswered,
    ctx: &Context,
    now_ms: i64,
) -> Result<Option<AppliedOffsetReset>, Error> {
    let cached = group
        .status
        .as_ref()
        .and_then(|status| status.applied_offset_reset.clone());
    let Some(reset) = &group.spec.offset_reset else {
        return Ok(cached);
    };
    if cached
        .as_ref()
        .is_some_and(|applied| applied.id == reset.id)
    {
        return Ok(cached);
    }
    if !unanswered.is_empty() {
        tracing::info!(reset = %reset.id, "offset reset waits until every broker answers");
        return Ok(cached);
    }
    // The watch's copy may lag a record this operator wrote: decide from the stored one.
    let groups: Api<ConsumerGroup> = Api::namespaced(ctx.client.clone(), &namespace_of(group)?);
    let name = group.name_any();
    let stored = groups
        .get(&name)
        .await
        .map_err(Error::kube(format!("reading ConsumerGroup {name}")))?;
    let status = stored.status.clone().unwrap_or_default();
    if let Some(applied) = status
        .applied_offset_reset
        .filter(|applied| applied.id == reset.id)
    {
        return Ok(Some(applied));
    }
    let key = reset_key(group, &reset.id);
    let seen = ctx.applied_resets(&key);
    let mut progress = resume(status.offset_reset_in_progress, &reset.id, &seen);
    // A broker scaled away since is no longer the reset's to settle.
    let interrupted = progress.applying.take();
    if let Some(attempt) =
        interrupted.filter(|attempt| addresses.iter().any(|addr| addr.0 == attempt.broker))
    {
        settle_interrupted(group, reset, attempt, &mut progress, ctx).await?;
    }
    let pending: Vec<&BrokerAddr> = addresses
        .iter()
        .filter(|addr| {
            !progress.applied_on.contains(&addr.0) && !progress.unconfirmed_on.contains(&addr.0)
        })
        .collect();
    for addr in pending {
        let offsets_digest = offsets_digest(group, addr, ctx).await?;
        progress.applying = Some(ResetAttempt {
            broker: addr.0.clone(),
            offsets_digest,
        });
        record(ctx, &stored, Some(progress.clone()), None).await?;
        reset_on(group, reset, addr, ctx).await?;
        ctx.note_applied_reset(&key, &addr.0);
        progress.applying = None;
        progress.applied_on.push(addr.0.clone());
    }
    let applied = AppliedOffsetReset {
        id: reset.id.clone(),
        to: reset.to,
        applied_at: timestamp(now_ms).to_string(),
        unconfirmed_on: progress.unconfirmed_on,
    };
    record(ctx, &stored, None, Some(applied.clone())).await?;
    ctx.forget_applied_resets(&key);
    publish(
        ctx,
        group,
        EventType::Normal,
        "OffsetsReset",
        "OffsetsReset",
        &applied_note(group, &applied),
    )
    .await;
    Ok(Some(applied))
}

/// The record to go on from: the stored one of this id (the brokers this operator saw the call
/// succeed on, `seen`, counted as applied), else a new one.
pub(super) fn resume(
    stored: Option<OffsetResetProgress>,
    id: &str,
    seen: &BTreeSet<String>,
) -> OffsetResetProgress {
    let mut progress = stored
        .filter(|progress| progress.id == id)
        .unwrap_or_else(|| OffsetResetProgress {
            id: id.to_string(),
            applied_on: Vec::new(),
            applying: None,
            unconfirmed_on: Vec::new(),
        });
    if let Some(attempt) = progress
        .applying
        .take_if(|attempt| seen.contains(&attempt.broker))
    {
        progress.applied_on.push(attempt.broker);
    }
    for broker in seen {
        if !progress.applied_on.contains(broker) {
            progress.applied_on.push(broker.clone());
        }
    }
    progress
}

/// What to do about a call whose outcome was never recorded: make it again (`true`) only while
/// the broker's committed offsets are those recorded before it.
pub(super) fn call_again(attempt: &ResetAttempt, offsets_digest_now: &str) -> bool {
    attempt.offsets_digest == offsets_digest_now
}

/// A call recorded as in flight by an operator that did not see its outcome: made again while
/// nothing moved, else reported and left (never rewinding consumers that moved past it).
async fn settle_interrupted(
    group: &ConsumerGroup,
    reset: &OffsetResetSpec,
    attempt: ResetAttempt,
    progress: &mut OffsetResetProgress,
    ctx: &Context,
) -> Result<(), Error> {
    let addr = BrokerAddr(attempt.broker.clone());
    let now = offsets_digest(group, &addr, ctx).await?;
    if call_again(&attempt, &now) {
        tracing::info!(reset = %reset.id, broker = %addr, "interrupted reset: offsets unchanged, calling again");
        return Ok(());
    }
    let message = format!(
        "offset reset {} on {} was interrupted before its outcome was recorded, and the group's \
         committed offsets there moved since: not reset again, so no consumer that moved past \
         the reset is rewound; set a new spec.offsetReset.id to reset it",
        reset.id, addr
    );
    publish(
        ctx,
        group,
        EventType::Warning,
        "OffsetResetUnconfirmed",
        "OffsetsReset",
        &message,
    )
    .await;
    progress.unconfirmed_on.push(attempt.broker);
    Ok(())
}

/// Writes the reset's record into the stored status (nothing else of it changes).
async fn record(
    ctx: &Context,
    group: &ConsumerGroup,
    progress: Option<OffsetResetProgress>,
    applied: Option<AppliedOffsetReset>,
) -> Result<(), Error> {
    let with_record = |stored: Option<&ConsumerGroupStatus>| {
        let mut status = stored.cloned().unwrap_or_default();
        status.offset_reset_in_progress = progress.clone();
        if let Some(applied) = &applied {
            status.applied_offset_reset = Some(applied.clone());
        }
        status
    };
    write_status(ctx, group, None, with_record).await?;
    Ok(())
}

/// The reset call on one broker, for every spec topic.
async fn reset_on(
    group: &ConsumerGroup,
    reset: &OffsetResetSpec,
    addr: &BrokerAddr,
    ctx: &Context,
) -> Result<(), Error> {
    let target = match reset.to {
        OffsetResetTarget::Earliest => ResetTarget::Earliest,
        OffsetResetTarget::Latest => ResetTarget::Latest,
        OffsetResetTarget::Timestamp => ResetTarget::Timestamp(reset.timestamp_millis.unwrap_or(0)),
    };
    for topic in &group.spec.topics {
        ctx.admin
            .reset_offsets(addr, &group.name_any(), topic, target)
            .await
            .map_err(Error::admin("resetting offsets"))?;
    }
    Ok(())
}

/// SHA-1 (hex) of the group's committed offsets of the spec topics on `addr`, by queue.
async fn offsets_digest(
    group: &ConsumerGroup,
    addr: &BrokerAddr,
    ctx: &Context,
) -> Result<String, Error> {
    let stats = ctx
        .admin
        .consume_stats(addr, &group.name_any())
        .await
        .map_err(Error::admin("reading committed offsets before a reset"))?;
    Ok(digest_of(&group.spec.topics, &stats.queues))
}

/// The digest of `queues`' committed offsets of `topics`, whatever order they come in.
pub(super) fn digest_of(topics: &[String], queues: &[QueueConsumeStats]) -> String {
    use sha1::{Digest, Sha1};
    let mut lines: Vec<String> = queues
        .iter()
        .filter(|queue| topics.contains(&queue.topic))
        .map(|queue| {
            let committed = queue.consumer_offset.map(|offset| offset.0);
            format!(
                "{}\t{}\t{}\t{committed:?}",
                queue.topic, queue.broker_name, queue.queue_id
            )
        })
        .collect();
    lines.sort();
    let digest = Sha1::digest(lines.join("\n").as_bytes());
    digest.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn applied_note(group: &ConsumerGroup, applied: &AppliedOffsetReset) -> String {
    let mut note = format!(
        "offsets of {} reset to {:?} (request {})",
        group.spec.topics.join(", "),
        applied.to,
        applied.id
    );
    if !applied.unconfirmed_on.is_empty() {
        note.push_str(&format!(
            "; not confirmed on {} (interrupted)",
            applied.unconfirmed_on.join(", ")
        ));
    }
    note
}

/// The key of a reset in the operator's memory: the object (by uid, a recreated group is
/// another) and the reset's id.
fn reset_key(group: &ConsumerGroup, id: &str) -> String {
    format!("{}/{}", group.uid().unwrap_or_default(), id)
}

fn namespace_of(group: &ConsumerGroup) -> Result<String, Error> {
    group.namespace().ok_or_else(|| Error::MissingField {
        kind: "ConsumerGroup",
        name: group.name_any(),
        field: "namespace",
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::QueueOffset;

    fn attempt(broker: &str, digest: &str) -> ResetAttempt {
        ResetAttempt {
            broker: broker.into(),
            offsets_digest: digest.into(),
        }
    }

    #[test]
    fn a_record_of_another_id_starts_over() {
        let stored = OffsetResetProgress {
            id: "old".into(),
            applied_on: vec!["b0".into()],
            applying: Some(attempt("b1", "d")),
            unconfirmed_on: Vec::new(),
        };
        let progress = resume(Some(stored), "new", &BTreeSet::new());
        assert_eq!(
            (progress.id.as_str(), progress.applied_on.len()),
            ("new", 0)
        );
        assert!(progress.applying.is_none());
    }

    #[test]
    fn a_call_this_operator_saw_succeed_counts_as_applied() {
        let stored = OffsetResetProgress {
            id: "r".into(),
            applied_on: vec!["b0".into()],
            applying: Some(attempt("b1", "d")),
            unconfirmed_on: Vec::new(),
        };
        let seen = BTreeSet::from(["b1".to_string()]);
        let progress = resume(Some(stored.clone()), "r", &seen);
        assert_eq!(progress.applied_on, ["b0", "b1"]);
        assert!(progress.applying.is_none(), "nothing left unknown");
        let unseen = resume(Some(stored), "r", &BTreeSet::new());
        assert_eq!(unseen.applied_on, ["b0"]);
        assert_eq!(unseen.applying, Some(attempt("b1", "d")), "outcome unknown");
    }

    #[test]
    fn an_interrupted_call_is_made_again_only_while_no_offset_moved() {
        let queue = |id: i32, committed: u64| QueueConsumeStats {
            topic: "orders".into(),
            broker_name: "qb-0".into(),
            queue_id: id,
            broker_offset: QueueOffset(100),
            consumer_offset: Some(QueueOffset(committed)),
            oldest_unconsumed_store_ms: None,
        };
        let topics = ["orders".to_string()];
        let before = digest_of(&topics, &[queue(0, 40), queue(1, 50)]);
        let recorded = attempt("qb-0", &before);
        let reordered = digest_of(&topics, &[queue(1, 50), queue(0, 40)]);
        assert!(call_again(&recorded, &reordered), "nothing moved");
        let consumed = digest_of(&topics, &[queue(0, 41), queue(1, 50)]);
        assert!(!call_again(&recorded, &consumed), "a consumer moved on");
        let rewound = digest_of(&topics, &[queue(0, 0), queue(1, 0)]);
        assert!(!call_again(&recorded, &rewound), "the reset ran");
    }

    #[test]
    fn a_pass_keeps_other_writers_conditions_and_the_reset_record_and_drops_its_own_unset_ones() {
        let now = Timestamp::from_second(2_000).unwrap();
        let foreign = conditions::merge(
            &[],
            &[
                Desired::new("example.com/Audited", true, "Audited", "ok"),
                Desired::new(QUEUES_STALLED, true, "Stalled", "an old pass's"),
            ],
            Some(1),
            now,
        );
        let record = OffsetResetProgress {
            id: "r".into(),
            applied_on: vec!["b0".into()],
            applying: None,
            unconfirmed_on: Vec::new(),
        };
        let stored = ConsumerGroupStatus {
            conditions: foreign.clone(),
            offset_reset_in_progress: Some(record.clone()),
            ..ConsumerGroupStatus::default()
        };
        let ours = ConsumerGroupStatus {
            conditions: conditions::merge(
                &[],
                &[Desired::new("Ready", true, "Polled", "")],
                Some(1),
                now,
            ),
            total_lag: Some(3),
            ..ConsumerGroupStatus::default()
        };
        let written = onto_stored(&ours, Some(&stored), now);
        assert_eq!(written.total_lag, Some(3));
        assert_eq!(written.offset_reset_in_progress, Some(record));
        let types: Vec<&str> = written
            .conditions
            .iter()
            .map(|c| c.type_.as_str())
            .collect();
        assert_eq!(
            types,
            ["Ready", "example.com/Audited"],
            "QueuesStalled is the pass's to decide: not set, so gone"
        );
    }
}
