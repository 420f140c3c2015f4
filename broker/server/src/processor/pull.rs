//! PULL_MESSAGE (11) with long polling, tag and SQL92 filters, and the commitOffset
//! piggy-back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use quiver_protocol::code::response;
use quiver_protocol::header::{
    PullMessageRequestHeader, PullMessageResponseHeader, PULL_FLAG_SUSPEND,
};
use quiver_protocol::sql92::expression_type;
use quiver_protocol::{HeaderError, RemotingCommand};
use quiver_store::{CommitLogOffset, GetFilter, GetResult, GetStatus, QueueOffset};

use super::{filter_code, Ctx, Refusal};
use crate::broker::Broker;
use crate::error::chain;
use crate::filter::{record_matches, ConsumerFilter, FilterError};
use crate::long_poll::{AnswerNow, Claim, ParkRefused, Wake};
use crate::service::consume;

/// Bytes of records one pull returns at most (RocketMQ's maxTransferBytesOnMessageInDisk).
const MAX_PULL_BYTES: u64 = 4 * 1024 * 1024;
/// Messages one pull returns at most, whatever the client asks.
const MAX_PULL_MESSAGES: u32 = 1024;
/// Longest a pull is parked, whatever the client asks.
const MAX_SUSPEND: Duration = Duration::from_secs(60);

struct PullRequest {
    group: String,
    topic: String,
    queue_id: u32,
    offset: QueueOffset,
    max_messages: u32,
    sys_flag: i32,
    /// Offset piggy-backed for the group (commit bit set, non-negative offset).
    commit: Option<QueueOffset>,
    suspend: Duration,
    filter: Arc<ConsumerFilter>,
    /// The group epoch the reader last pulled in (Quiver's own clients).
    epoch: Option<u64>,
}

/// The filter a pull runs: its own expression when it carries one (the heartbeat's compiled
/// filter when it is the same expression), else the one its group's heartbeat registered.
/// An expression that cannot be served is refused, never matched as something else (a SQL92
/// text hashed as a tag would match nothing and move the group past every message).
fn pull_filter(
    ctx: &Ctx,
    header: &PullMessageRequestHeader,
) -> Result<Arc<ConsumerFilter>, Refusal> {
    let registered = || {
        ctx.broker
            .consumers()
            .filter(&header.consumer_group, &header.topic)
    };
    if header.has_subscription() {
        let kind = header.expression_type.as_deref();
        let expression = header.subscription.as_deref().unwrap_or("*");
        // A tag expression costs less to compile than to look up.
        if expression_type::is_sql92(kind) {
            if let Some(Ok(filter)) = registered()
                .filter(|known| known.is_for(kind, expression))
                .map(|known| known.filter)
            {
                return Ok(filter);
            }
        }
        return ConsumerFilter::compile(kind, expression)
            .map(Arc::new)
            .map_err(|error| {
                Refusal::new(
                    filter_code(&error),
                    format!(
                        "the pull's subscription cannot be served: {}",
                        chain(&error)
                    ),
                )
            });
    }
    match registered().map(|known| known.filter) {
        None => Ok(Arc::new(ConsumerFilter::All)),
        Some(Ok(filter)) => Ok(filter),
        // Apache's answer when the heartbeat's expression did not compile.
        Some(Err(error)) => Err(Refusal::new(
            match error {
                FilterError::Parse { .. } => response::FILTER_DATA_NOT_EXIST,
                FilterError::Unsupported { .. } => response::SYSTEM_ERROR,
            },
            format!(
                "the subscription group {} registered for topic {} cannot be served: {}",
                header.consumer_group,
                header.topic,
                chain(&error)
            ),
        )),
    }
}

impl PullRequest {
    fn parse(ctx: &Ctx, req: &RemotingCommand) -> Result<PullRequest, Refusal> {
        let header = PullMessageRequestHeader::from_command(req)?;
        let filter = pull_filter(ctx, &header)?;
        let queue_id = u32::try_from(header.queue_id).map_err(|_| HeaderError::Invalid {
            field: "queueId",
            value: header.queue_id.to_string(),
        })?;
        let offset = u64::try_from(header.queue_offset).map_err(|_| HeaderError::Invalid {
            field: "queueOffset",
            value: header.queue_offset.to_string(),
        })?;
        Ok(PullRequest {
            queue_id,
            offset: QueueOffset(offset),
            max_messages: u32::try_from(header.max_msg_nums)
                .unwrap_or(1)
                .clamp(1, MAX_PULL_MESSAGES),
            sys_flag: header.sys_flag,
            commit: header.offset_to_commit().map(QueueOffset),
            suspend: Duration::from_millis(
                u64::try_from(header.suspend_timeout_millis).unwrap_or(0),
            )
            .min(MAX_SUSPEND),
            filter,
            epoch: header.quiver_epoch,
            group: header.consumer_group,
            topic: header.topic,
        })
    }
}

/// What a store read means for the client.
enum Answer {
    Found(GetResult),
    /// Nothing new: may be parked.
    NotFound(GetResult),
    RetryImmediately(GetResult),
    OffsetMoved(GetResult),
}

fn classify(requested: QueueOffset, got: GetResult) -> Answer {
    match got.status {
        GetStatus::Found => Answer::Found(got),
        GetStatus::NoMatchedMessage => Answer::RetryImmediately(got),
        GetStatus::OffsetOverflowOne => Answer::NotFound(got),
        GetStatus::NoMessageInQueue if requested.0 == 0 => Answer::NotFound(got),
        GetStatus::NoMessageInQueue
        | GetStatus::OffsetOverflowBadly
        | GetStatus::OffsetTooSmall => Answer::OffsetMoved(got),
    }
}

/// Reads on the calling task: a get is index lookups and views of mapped memory, cheaper
/// than two thread hand-offs to the blocking pool.
fn read(broker: &Broker, pull: &PullRequest) -> Result<Answer, Refusal> {
    let filter = &pull.filter;
    let by_properties = filter
        .selector()
        .map(|selector| move |record: &[u8]| record_matches(selector, record));
    let got = broker.store().get_filtered(
        &pull.topic,
        pull.queue_id,
        pull.offset,
        pull.max_messages,
        MAX_PULL_BYTES,
        &GetFilter {
            tags_code: &|code| filter.accepts_tags_code(code),
            record: by_properties
                .as_ref()
                .map(|accepts| accepts as &dyn Fn(&[u8]) -> bool),
        },
    )?;
    Ok(classify(pull.offset, got))
}

/// A reader that last pulled in an older epoch, positioned past where that epoch's data ends
/// (the next epoch's start, held here), read a tail a failover cut: it is moved back there,
/// to read what the group wrote in its place (Kafka's KIP-320).
fn past_its_epoch(broker: &Broker, pull: &PullRequest) -> Option<GetResult> {
    let replication = broker.replication().as_ref()?;
    let epoch_end = replication
        .state()
        .truncation_point(pull.epoch?, u64::MAX)
        .filter(|end| *end != u64::MAX && *end <= broker.store().confirmed().0)?;
    let store = broker.store();
    let back_to = store.queue_offset_at(&pull.topic, pull.queue_id, CommitLogOffset(epoch_end));
    (pull.offset > back_to).then(|| GetResult {
        status: GetStatus::OffsetOverflowBadly,
        messages: Vec::new(),
        next_begin_offset: back_to,
        min_offset: store.min_offset(&pull.topic, pull.queue_id),
        max_offset: store.max_offset(&pull.topic, pull.queue_id),
    })
}

/// `trace` learns when a dispatch woke the parked pull. `None`: the dispatch answered it.
pub async fn handle(
    ctx: &Ctx,
    req: &RemotingCommand,
    trace: &mut crate::stages::Trace,
) -> Result<Option<RemotingCommand>, Refusal> {
    let broker = &ctx.broker;
    consume::check_broker_readable(broker)?;
    let pull = Arc::new(PullRequest::parse(ctx, req)?);
    consume::pull_topic(broker, &pull.group, &pull.topic, pull.queue_id)?;
    if let Some(commit) = pull.commit {
        consume::commit_offset(broker, &pull.group, &pull.topic, pull.queue_id, commit);
    }
    if let Some(moved) = past_its_epoch(broker, &pull) {
        return Ok(Some(respond(
            broker,
            req,
            &pull,
            Answer::OffsetMoved(moved),
        )));
    }
    let answer = match read_or_park(ctx, &pull, req, trace).await? {
        Some(answer) => answer,
        None => return Ok(None),
    };
    Ok(Some(respond(broker, req, &pull, answer)))
}

/// Reads; while there is nothing new and the pull may wait, parks until a dispatch, the
/// suspend timeout or shutdown. `None` when the dispatching thread answered the pull.
async fn read_or_park(
    ctx: &Ctx,
    pull: &Arc<PullRequest>,
    req: &RemotingCommand,
    trace: &mut crate::stages::Trace,
) -> Result<Option<Answer>, Refusal> {
    let broker = &ctx.broker;
    let deadline = Instant::now() + pull.suspend;
    let may_park = pull.sys_flag & PULL_FLAG_SUSPEND != 0 && !pull.suspend.is_zero();
    loop {
        let answer = read(broker, pull)?;
        if !may_park || !matches!(answer, Answer::NotFound(_)) {
            return Ok(Some(answer));
        }
        let answer_now = answer_at_dispatch(ctx, pull, req, trace);
        let parked = match broker.long_poll().park(
            &pull.topic,
            pull.queue_id,
            ctx.connection.id,
            Some(answer_now),
        ) {
            Ok(parked) => parked,
            Err(ParkRefused::Full) => {
                tracing::debug!("parked-pull bound reached; answering at once");
                return Ok(Some(answer));
            }
            Err(ParkRefused::ShuttingDown) => return Ok(Some(answer)),
            // Apache clients back off after SYSTEM_BUSY instead of pulling again at once.
            Err(ParkRefused::ConnectionFull) => {
                let max = broker.config().max_parked_pulls_per_connection;
                let remark = format!(
                    "this connection has {max} pulls parked already \
                     (max-parked-pulls-per-connection)"
                );
                return Err(Refusal::new(response::SYSTEM_BUSY, remark));
            }
        };
        // Looked at again once parked, so a dispatch between the first look and the park is
        // not missed; what it finds is answered here unless that dispatch answered already.
        let answer = read(broker, pull)?;
        if !matches!(answer, Answer::NotFound(_)) {
            return Ok(parked.claim_for_task().then_some(answer));
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        match parked.wait(remaining).await {
            Some(Wake::Dispatched(at)) => trace.woken(at),
            Some(Wake::Answered) => return Ok(None),
            Some(Wake::Shutdown) | None => return read(broker, pull).map(Some),
        }
    }
}

/// What the dispatch hook runs for a parked pull: reads the queue on the dispatching thread
/// and, when there is something for the pull and room in its connection's queue, answers it
/// there, sparing the wake-up of the pull's task; else leaves the pull to its task.
fn answer_at_dispatch(
    ctx: &Ctx,
    pull: &Arc<PullRequest>,
    req: &RemotingCommand,
    trace: &crate::stages::Trace,
) -> AnswerNow {
    let broker = ctx.broker.clone();
    let remoting = ctx.connection.remoting.clone();
    let pull = pull.clone();
    // What an answer takes from the request (opaque, serialization): not its fields.
    let template = req.response_to(response::SUCCESS, None);
    let mut trace = trace.clone();
    Box::new(move |dispatched: Instant, claim: &Claim| {
        let Ok(Answer::Found(got)) = read(&broker, &pull) else {
            return false;
        };
        let Some(slot) = remoting.try_reserve() else {
            return false;
        };
        if !claim.take() {
            // The task timed out and answers: nothing to do here.
            return true;
        }
        trace.woken(dispatched);
        let reply = respond(&broker, &template, &pull, Answer::Found(got));
        slot.send(reply, broker.stages().answered(trace));
        true
    })
}

fn respond(
    broker: &Broker,
    req: &RemotingCommand,
    pull: &PullRequest,
    answer: Answer,
) -> RemotingCommand {
    let (code, got) = match answer {
        Answer::Found(got) => (response::SUCCESS, got),
        Answer::NotFound(got) => (response::PULL_NOT_FOUND, got),
        Answer::RetryImmediately(got) => (response::PULL_RETRY_IMMEDIATELY, got),
        Answer::OffsetMoved(got) => (response::PULL_OFFSET_MOVED, got),
    };
    let as_i64 = |offset: QueueOffset| i64::try_from(offset.0).unwrap_or(i64::MAX);
    let header = PullMessageResponseHeader {
        suggest_which_broker_id: 0,
        next_begin_offset: as_i64(got.next_begin_offset),
        min_offset: as_i64(got.min_offset),
        max_offset: as_i64(got.max_offset),
        quiver_epoch: broker.replication().as_ref().and_then(|r| r.role().epoch()),
    };
    let mut reply = req.response_to(code, None).with_ext_fields(header.to_ext());
    if code == response::SUCCESS {
        let body_bytes: u64 = got.messages.iter().map(|m| record_body_len(m)).sum();
        broker.metrics().record_out(
            &pull.topic,
            &pull.group,
            got.messages.len() as u64,
            body_bytes,
        );
        // The records go out as they are stored (mapped views), never joined into one buffer.
        reply.body_chain = got.messages;
    }
    reply
}

/// BODY length of a stored record (for the throughput metric), from its fixed layout.
fn record_body_len(record: &[u8]) -> u64 {
    const SYS_FLAG_AT: usize = 36;
    const BODY_LEN_AT_V4: usize = 84;
    let sys_flag = record
        .get(SYS_FLAG_AT..SYS_FLAG_AT + 4)
        .map_or(0, |b| i32::from_be_bytes([b[0], b[1], b[2], b[3]]));
    let at = BODY_LEN_AT_V4
        + if sys_flag & quiver_store::record::BORN_HOST_V6_FLAG != 0 {
            12
        } else {
            0
        }
        + if sys_flag & quiver_store::record::STORE_HOST_V6_FLAG != 0 {
            12
        } else {
            0
        };
    record.get(at..at + 4).map_or(0, |b| {
        u64::try_from(i32::from_be_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0)
    })
}
