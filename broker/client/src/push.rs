//! The push consumer (clustering mode): heartbeats, rebalance, one pull loop per assigned
//! queue, concurrent or orderly consumption, send-back of failures, offset commits.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use quiver_protocol::header::UnregisterClientRequestHeader;
use quiver_protocol::offset::QueueOffset;
use quiver_protocol::{code, ExtFields, RemotingCommand};
use tokio::sync::{mpsc, watch, Notify, Semaphore};
use tokio::task::JoinHandle;

use crate::allocate::allocate_averagely;
use crate::client::{ClientConfig, ClientCore};
use crate::error::{ClientError, Result};
use crate::message::ReceivedMessage;
use crate::offset_store::{OffsetTable, UpdateMode};
use crate::ops::{PullSpec, PullStatus, SendBackTarget};
use crate::process_queue::{CommitPoint, ProcessQueue};
use crate::pull_from_where::{
    compute_pull_from_where, ConsumeFromWhere, StartPosition, RETRY_TOPIC_PREFIX,
};
use crate::remoting::{expect_success, InboundRequest};
use crate::subscription::{MessageSelector, Subscription};
use crate::MessageQueue;

/// What the listener says about a batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConsumeOutcome {
    Success,
    /// Concurrent mode: send the batch back for redelivery later. Orderly mode: retry the
    /// batch on this queue after a pause, keeping the order.
    Retry,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ConsumeMode {
    #[default]
    Concurrent,
    /// One batch at a time per queue, in queue order, holding the broker's queue lock.
    Orderly,
}

/// Consumes a batch; runs on a blocking thread, so it may do blocking work.
pub type Listener = Arc<dyn Fn(&[ReceivedMessage]) -> ConsumeOutcome + Send + Sync>;

#[derive(Clone, Debug)]
pub struct PushConsumerConfig {
    pub client: ClientConfig,
    pub group: String,
    /// (topic, tag or SQL92 selector) pairs; `%RETRY%group` is added automatically.
    pub subscriptions: Vec<(String, MessageSelector)>,
    pub consume_from: ConsumeFromWhere,
    pub mode: ConsumeMode,
    /// Messages handed to the listener at once.
    pub consume_batch_size: usize,
    /// Messages asked for per pull.
    pub pull_batch_size: u32,
    /// Flow control: a queue never holds more in-flight messages than this...
    pub max_in_flight_messages_per_queue: usize,
    /// ...and stops pulling once it holds this many in-flight bytes.
    pub max_in_flight_bytes_per_queue: u64,
    /// Deliveries before the broker moves a message to `%DLQ%group`.
    pub max_reconsume_times: i32,
    /// Listener calls running at once (concurrent mode).
    pub consume_concurrency: usize,
    /// How long the broker holds a pull that finds nothing.
    pub long_poll: Duration,
    pub heartbeat_interval: Duration,
    pub rebalance_interval: Duration,
    pub persist_interval: Duration,
    /// Pause before a failed batch is consumed again locally (send-back failed, or orderly).
    pub retry_pause: Duration,
    /// Delay level of redeliveries (1 = 1 s, 2 = 5 s, ...); None lets the broker pick
    /// 3 + reconsumeTimes, as RocketMQ does.
    pub retry_delay_level: Option<u32>,
}

impl PushConsumerConfig {
    pub fn new(servers: &str, group: impl Into<String>) -> Self {
        Self {
            client: ClientConfig::new(servers),
            group: group.into(),
            subscriptions: Vec::new(),
            consume_from: ConsumeFromWhere::LastOffset,
            mode: ConsumeMode::Concurrent,
            consume_batch_size: 1,
            pull_batch_size: 32,
            max_in_flight_messages_per_queue: 1000,
            max_in_flight_bytes_per_queue: 100 * 1024 * 1024,
            max_reconsume_times: 16,
            consume_concurrency: 20,
            long_poll: Duration::from_secs(15),
            heartbeat_interval: Duration::from_secs(10),
            rebalance_interval: Duration::from_secs(20),
            persist_interval: Duration::from_secs(5),
            retry_pause: Duration::from_secs(1),
            retry_delay_level: None,
        }
    }

    pub fn subscribe(
        mut self,
        topic: impl Into<String>,
        expression: impl Into<MessageSelector>,
    ) -> Self {
        self.subscriptions.push((topic.into(), expression.into()));
        self
    }

    pub fn consume_from(mut self, from: ConsumeFromWhere) -> Self {
        self.consume_from = from;
        self
    }

    pub fn mode(mut self, mode: ConsumeMode) -> Self {
        self.mode = mode;
        self
    }

    fn validate(&self) -> Result<()> {
        let invalid = |what, reason: &str| {
            Err(ClientError::InvalidArgument {
                what,
                reason: reason.to_owned(),
            })
        };
        if self.group.is_empty() {
            return invalid("group", "must not be empty");
        }
        if self.subscriptions.is_empty() {
            return invalid("subscriptions", "subscribe to at least one topic");
        }
        if self.consume_batch_size == 0
            || self.pull_batch_size == 0
            || self.consume_concurrency == 0
            || self.max_in_flight_messages_per_queue == 0
        {
            return invalid(
                "batch sizes",
                "consume_batch_size, pull_batch_size, consume_concurrency and max_in_flight_messages_per_queue must be > 0",
            );
        }
        Ok(())
    }
}

/// One assigned queue: its in-flight messages and its pull loop.
struct QueueState {
    queue: MessageQueue,
    process_queue: Mutex<ProcessQueue<ReceivedMessage>>,
    stop: watch::Sender<bool>,
    space_freed: Notify,
    task: Mutex<Option<JoinHandle<()>>>,
    /// Orderly mode: the broker lock counts as held until then (renewed on every rebalance).
    locked_until: Mutex<Option<Instant>>,
}

/// How long a broker queue lock is trusted after it was granted (RocketMQ's 30 s).
const LOCK_TRUSTED_FOR: Duration = Duration::from_secs(30);

impl QueueState {
    fn new(queue: MessageQueue) -> Arc<Self> {
        Arc::new(Self {
            queue,
            process_queue: Mutex::new(ProcessQueue::new()),
            stop: watch::channel(false).0,
            space_freed: Notify::new(),
            task: Mutex::new(None),
            locked_until: Mutex::new(None),
        })
    }

    fn lock_granted(&self) {
        *self.locked_until.lock() = Some(Instant::now() + LOCK_TRUSTED_FOR);
    }

    fn holds_lock(&self) -> bool {
        self.locked_until
            .lock()
            .is_some_and(|until| Instant::now() < until)
    }

    fn is_dropped(&self) -> bool {
        self.process_queue.lock().is_dropped()
    }

    fn is_stopping(&self) -> bool {
        *self.stop.borrow()
    }

    /// Stops the pull loop; in-flight results no longer move the offset.
    async fn stop(&self) {
        self.process_queue.lock().mark_dropped();
        self.stop_pulling().await;
    }

    /// Shutdown: stops the pull loop and new listener calls; calls already running still
    /// commit their progress.
    async fn stop_pulling(&self) {
        self.stop.send_replace(true);
        let task = self.task.lock().take();
        if let Some(task) = task {
            // The loop only awaits cancellable operations, so this ends promptly.
            let _ = task.await;
        }
    }
}

struct Inner {
    core: Arc<ClientCore>,
    config: PushConsumerConfig,
    listener: Listener,
    subscriptions: Vec<Subscription>,
    offsets: OffsetTable<MessageQueue>,
    assignments: Mutex<BTreeMap<MessageQueue, Arc<QueueState>>>,
    /// Serialises rebalance, reset and shutdown, which all change the assignment.
    assignment_change: tokio::sync::Mutex<()>,
    rebalance_wanted: Notify,
    consume_permits: Arc<Semaphore>,
    shut_down: AtomicBool,
}

pub struct PushConsumer {
    inner: Arc<Inner>,
    background: Vec<JoinHandle<()>>,
    stop_background: watch::Sender<bool>,
}

impl PushConsumer {
    /// Starts heartbeats, rebalancing and pulling; returns once the first rebalance ran.
    pub async fn start(config: PushConsumerConfig, listener: Listener) -> Result<Self> {
        config.validate()?;
        let (inbound_tx, inbound_rx) = mpsc::unbounded_channel();
        let core = ClientCore::with_inbound(config.client.clone(), inbound_tx);
        let mut subscriptions: Vec<Subscription> = config
            .subscriptions
            .iter()
            .map(|(topic, selector)| Subscription::with_selector(topic.clone(), selector))
            .collect::<Result<_>>()?;
        // Failed messages come back through the group's retry topic.
        subscriptions.push(Subscription::new(
            format!("{RETRY_TOPIC_PREFIX}{}", config.group),
            "*",
        ));
        let inner = Arc::new(Inner {
            core,
            consume_permits: Arc::new(Semaphore::new(config.consume_concurrency)),
            config,
            listener,
            subscriptions,
            offsets: OffsetTable::new(),
            assignments: Mutex::new(BTreeMap::new()),
            assignment_change: tokio::sync::Mutex::new(()),
            rebalance_wanted: Notify::new(),
            shut_down: AtomicBool::new(false),
        });
        for subscription in &inner.subscriptions {
            match inner.core.fetch_route(&subscription.topic).await {
                Ok(_) => {}
                // The retry topic appears once the broker sees the group; the timer picks it up.
                Err(ClientError::TopicNotFound { .. })
                    if subscription.topic.starts_with(RETRY_TOPIC_PREFIX) => {}
                Err(error) => return Err(error),
            }
        }
        inner.send_heartbeats().await?;
        inner.rebalance().await;

        let (stop_background, stop_rx) = watch::channel(false);
        let background = vec![
            tokio::spawn(inner.clone().run_inbound(inbound_rx, stop_rx.clone())),
            tokio::spawn(inner.clone().run_timers(stop_rx)),
        ];
        Ok(Self {
            inner,
            background,
            stop_background,
        })
    }

    pub fn client_id(&self) -> &str {
        self.inner.core.client_id()
    }

    /// The queues this member currently consumes.
    pub fn assigned_queues(&self) -> Vec<MessageQueue> {
        self.inner.assignments.lock().keys().cloned().collect()
    }

    /// The offset this member would commit for `queue` now.
    pub fn local_offset(&self, queue: &MessageQueue) -> Option<QueueOffset> {
        self.inner.offsets.read(queue)
    }

    /// In-flight (pulled, not yet consumed) messages and bytes of an assigned queue.
    pub fn in_flight(&self, queue: &MessageQueue) -> Option<(usize, u64)> {
        let state = self.inner.assignments.lock().get(queue).cloned()?;
        let pq = state.process_queue.lock();
        Some((pq.message_count(), pq.bytes_in_flight()))
    }

    /// Asks for a rebalance now (also happens on the timer and on broker notification).
    pub fn request_rebalance(&self) {
        self.inner.rebalance_wanted.notify_one();
    }

    /// Clean stop: waits for running listener calls, commits every offset, leaves the group.
    pub async fn shutdown(mut self) -> Result<()> {
        self.inner.shut_down.store(true, Ordering::Release);
        self.stop_background.send_replace(true);
        for task in self.background.drain(..) {
            let _ = task.await;
        }
        let _guard = self.inner.assignment_change.lock().await;
        let states: Vec<Arc<QueueState>> =
            self.inner.assignments.lock().values().cloned().collect();
        for state in &states {
            state.stop_pulling().await;
        }
        // Every permit free means no listener call is still running.
        let all = u32::try_from(self.inner.config.consume_concurrency).unwrap_or(u32::MAX);
        let drained = tokio::time::timeout(
            Duration::from_secs(30),
            self.inner.consume_permits.acquire_many(all),
        )
        .await;
        if drained.is_err() {
            tracing::warn!(group = %self.inner.config.group, "listener calls still running after 30 s; committing what is done");
        }
        for state in &states {
            state.process_queue.lock().mark_dropped();
        }
        let mut first_error = None;
        for state in &states {
            if let Err(error) = self.inner.persist_offset(&state.queue).await {
                first_error.get_or_insert(error);
            }
        }
        if self.inner.config.mode == ConsumeMode::Orderly {
            self.inner
                .unlock(&states.iter().map(|s| s.queue.clone()).collect::<Vec<_>>())
                .await;
        }
        self.inner.assignments.lock().clear();
        self.inner.unregister().await;
        self.inner.core.shutdown().await;
        first_error.map_or(Ok(()), Err)
    }

    /// Stops at once without committing or unregistering, as a crashed process would.
    pub async fn abort(mut self) {
        self.inner.shut_down.store(true, Ordering::Release);
        for task in self.background.drain(..) {
            task.abort();
        }
        let states: Vec<Arc<QueueState>> =
            self.inner.assignments.lock().values().cloned().collect();
        for state in states {
            state.process_queue.lock().mark_dropped();
            if let Some(task) = state.task.lock().take() {
                task.abort();
            }
        }
        self.inner.core.shutdown().await;
    }
}

impl Drop for PushConsumer {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
        for state in self.inner.assignments.lock().values() {
            state.process_queue.lock().mark_dropped();
            state.stop.send_replace(true);
        }
    }
}

impl Inner {
    fn group(&self) -> &str {
        &self.config.group
    }

    async fn send_heartbeats(&self) -> Result<()> {
        use quiver_protocol::body::{self as wire, ConsumerData, HeartbeatData, SubscriptionData};
        let consumer = ConsumerData {
            group_name: self.group().to_owned(),
            consume_type: wire::ConsumeType::ConsumePassively,
            message_model: wire::MessageModel::Clustering,
            consume_from_where: match self.config.consume_from {
                ConsumeFromWhere::LastOffset => wire::ConsumeFromWhere::LastOffset,
                ConsumeFromWhere::FirstOffset => wire::ConsumeFromWhere::FirstOffset,
                ConsumeFromWhere::Timestamp(_) => wire::ConsumeFromWhere::Timestamp,
            },
            subscription_data_set: self
                .subscriptions
                .iter()
                .map(|s| SubscriptionData {
                    topic: s.topic.clone(),
                    sub_string: s.expression().to_owned(),
                    tags_set: s.tags().iter().cloned().collect(),
                    code_set: s.tag_codes().into_iter().map(|c| c as i32).collect(),
                    sub_version: s.version(),
                    expression_type: Some(s.expression_type().into()),
                    ..Default::default()
                })
                .collect(),
            unit_mode: false,
        };
        let heartbeat = HeartbeatData {
            client_id: self.core.client_id().to_owned(),
            producer_data_set: Vec::new(),
            consumer_data_set: vec![consumer],
        };
        let body = heartbeat.encode();
        let brokers = self.core.known_brokers();
        if brokers.is_empty() {
            return Err(ClientError::NoRoute {
                topic: self.subscriptions[0].topic.clone(),
                purpose: "heartbeats",
            });
        }
        let mut last_error = None;
        let mut any_ok = false;
        for addr in brokers {
            let request = RemotingCommand::request(code::request::HEART_BEAT, ExtFields::default())
                .with_body(body.clone());
            match self
                .core
                .invoke(&addr, request)
                .await
                .and_then(|r| expect_success(&addr, code::request::HEART_BEAT, r))
            {
                Ok(_) => any_ok = true,
                Err(error) => {
                    tracing::warn!(%addr, %error, "heartbeat failed");
                    last_error = Some(error);
                }
            }
        }
        match (any_ok, last_error) {
            (false, Some(error)) => Err(error),
            _ => Ok(()),
        }
    }

    async fn unregister(&self) {
        for addr in self.core.known_brokers() {
            let header = UnregisterClientRequestHeader {
                client_id: self.core.client_id().to_owned(),
                producer_group: None,
                consumer_group: Some(self.group().to_owned()),
            };
            let request =
                RemotingCommand::request(code::request::UNREGISTER_CLIENT, header.to_ext());
            if let Err(error) = self.core.invoke(&addr, request).await {
                tracing::debug!(%addr, %error, "unregister failed");
            }
        }
    }

    /// Handles broker-initiated requests until stopped.
    async fn run_inbound(
        self: Arc<Self>,
        mut inbound: mpsc::UnboundedReceiver<InboundRequest>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let request = tokio::select! {
                request = inbound.recv() => match request { Some(r) => r, None => return },
                _ = stop.changed() => return,
            };
            let command = &request.command;
            let response_code = match command.code {
                code::request::NOTIFY_CONSUMER_IDS_CHANGED => {
                    self.rebalance_wanted.notify_one();
                    code::response::SUCCESS
                }
                code::request::RESET_CONSUMER_CLIENT_OFFSET => {
                    match self.reset_offsets(&request.addr, command).await {
                        Ok(()) => code::response::SUCCESS,
                        Err(error) => {
                            tracing::warn!(%error, "offset reset from the broker failed");
                            code::response::SYSTEM_ERROR
                        }
                    }
                }
                _ => code::response::REQUEST_CODE_NOT_SUPPORTED,
            };
            if !command.is_oneway() {
                let response = command.response_to(response_code, None);
                if let Err(error) = self.core.remoting.reply(&request.addr, response).await {
                    tracing::debug!(%error, "reply to broker request failed");
                }
            }
        }
    }

    /// Heartbeats, rebalances, offset persistence and route refresh on their timers.
    async fn run_timers(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut heartbeat = tokio::time::interval(self.config.heartbeat_interval);
        let mut rebalance = tokio::time::interval(self.config.rebalance_interval);
        let mut persist = tokio::time::interval(self.config.persist_interval);
        // The first tick of each is immediate; start() already did all three.
        heartbeat.tick().await;
        rebalance.tick().await;
        persist.tick().await;
        loop {
            tokio::select! {
                _ = stop.changed() => return,
                _ = heartbeat.tick() => {
                    self.core.refresh_routes().await;
                    if let Err(error) = self.send_heartbeats().await {
                        tracing::warn!(%error, "heartbeat round failed");
                    }
                }
                _ = rebalance.tick() => self.rebalance().await,
                _ = self.rebalance_wanted.notified() => self.rebalance().await,
                _ = persist.tick() => self.persist_all().await,
            }
        }
    }

    async fn persist_all(&self) {
        let assigned: Vec<MessageQueue> = self.assignments.lock().keys().cloned().collect();
        for queue in assigned {
            if let Some(offset) = self.offsets.read(&queue) {
                if let Err(error) = self
                    .core
                    .update_consumer_offset(self.group(), &queue, offset, false)
                    .await
                {
                    tracing::debug!(%error, queue = %queue, "offset persist failed");
                }
            }
        }
    }

    /// Commits one queue's offset and waits for the broker's answer.
    async fn persist_offset(&self, queue: &MessageQueue) -> Result<()> {
        match self.offsets.read(queue) {
            Some(offset) => {
                self.core
                    .update_consumer_offset(self.group(), queue, offset, true)
                    .await
            }
            None => Ok(()),
        }
    }

    async fn rebalance(self: &Arc<Self>) {
        if self.shut_down.load(Ordering::Acquire) {
            return;
        }
        let _guard = self.assignment_change.lock().await;
        for subscription in &self.subscriptions {
            if let Err(error) = self.rebalance_topic(&subscription.topic).await {
                tracing::debug!(topic = %subscription.topic, %error, "rebalance skipped this topic");
            }
        }
        if self.config.mode == ConsumeMode::Orderly {
            // Keep the locks alive (the broker expires them after 60 s).
            let held: Vec<MessageQueue> = self.assignments.lock().keys().cloned().collect();
            for queue in self.lock(&held).await {
                if let Some(state) = self.assignments.lock().get(&queue) {
                    state.lock_granted();
                }
            }
        }
    }

    async fn rebalance_topic(self: &Arc<Self>, topic: &str) -> Result<()> {
        let route = self.core.fetch_route(topic).await?;
        // Every broker knows the group's members; ask them in turn until one answers.
        let mut members = None;
        let mut last_error = None;
        for addr in route.brokers.values() {
            match self.core.consumer_ids(addr, self.group()).await {
                Ok(ids) => {
                    members = Some(ids);
                    break;
                }
                Err(error) => last_error = Some(error),
            }
        }
        let Some(members) = members else {
            return Err(last_error.unwrap_or(ClientError::NoRoute {
                topic: topic.to_owned(),
                purpose: "rebalance",
            }));
        };
        let wanted = allocate_averagely(&route.read_queues, &members, self.core.client_id());
        let current: Vec<MessageQueue> = self
            .assignments
            .lock()
            .keys()
            .filter(|q| q.topic == topic)
            .cloned()
            .collect();
        for queue in current.iter().filter(|q| !wanted.contains(q)) {
            self.remove_queue(queue).await;
        }
        let added: Vec<MessageQueue> = wanted
            .into_iter()
            .filter(|q| !current.contains(q))
            .collect();
        if added.is_empty() {
            return Ok(());
        }
        tracing::info!(group = %self.group(), %topic, added = added.len(), "rebalance assigned queues");
        let startable = match self.config.mode {
            ConsumeMode::Concurrent => added,
            ConsumeMode::Orderly => self.lock(&added).await,
        };
        for queue in startable {
            if let Err(error) = self.add_queue(queue.clone()).await {
                tracing::warn!(queue = %queue, %error, "could not start consuming a newly assigned queue");
            }
        }
        Ok(())
    }

    /// Taken away: stop pulling, commit its offset, forget it.
    async fn remove_queue(&self, queue: &MessageQueue) {
        let state = self.assignments.lock().remove(queue);
        if let Some(state) = state {
            state.stop().await;
        }
        if let Err(error) = self.persist_offset(queue).await {
            tracing::warn!(queue = %queue, %error, "could not commit the offset of a removed queue");
        }
        self.offsets.remove(queue);
        if self.config.mode == ConsumeMode::Orderly {
            self.unlock(std::slice::from_ref(queue)).await;
        }
    }

    async fn add_queue(self: &Arc<Self>, queue: MessageQueue) -> Result<()> {
        // A stale local offset from an earlier assignment must not win over the broker's.
        self.offsets.remove(&queue);
        let committed = self
            .core
            .query_consumer_offset(self.group(), &queue)
            .await?;
        let start = match compute_pull_from_where(committed, self.config.consume_from, &queue.topic)
        {
            StartPosition::At(offset) => offset,
            StartPosition::QueueMax => self.core.max_offset(&queue).await?,
            StartPosition::SearchTimestamp(ts) => self.core.search_offset(&queue, ts).await?,
        };
        // Orderly queues reach here only once the broker granted their lock.
        let locked_until =
            (self.config.mode == ConsumeMode::Orderly).then(|| Instant::now() + LOCK_TRUSTED_FOR);
        self.start_queue(queue, start, locked_until);
        Ok(())
    }

    fn start_queue(
        self: &Arc<Self>,
        queue: MessageQueue,
        start: QueueOffset,
        locked_until: Option<Instant>,
    ) {
        let state = QueueState::new(queue.clone());
        *state.locked_until.lock() = locked_until;
        let task = tokio::spawn(self.clone().pull_loop(state.clone(), start));
        *state.task.lock() = Some(task);
        self.assignments.lock().insert(queue, state);
    }

    /// RESET_CONSUMER_CLIENT_OFFSET: move assigned queues to the broker's offsets.
    async fn reset_offsets(self: &Arc<Self>, addr: &str, command: &RemotingCommand) -> Result<()> {
        let body =
            quiver_protocol::body::ResetOffsetBody::decode(&command.body).map_err(|source| {
                ClientError::Body {
                    addr: addr.to_owned(),
                    request_code: code::request::RESET_CONSUMER_CLIENT_OFFSET,
                    source,
                }
            })?;
        let _guard = self.assignment_change.lock().await;
        for (queue, offset) in body.offset_table {
            let state = self.assignments.lock().remove(&queue);
            let Some(state) = state else { continue };
            state.stop().await;
            let locked_until = *state.locked_until.lock();
            let offset = QueueOffset(u64::try_from(offset).unwrap_or(0));
            self.offsets.update(&queue, offset, UpdateMode::Overwrite);
            self.persist_offset(&queue).await?;
            tracing::info!(queue = %queue, %offset, "offset reset by the broker");
            self.start_queue(queue, offset, locked_until);
        }
        Ok(())
    }

    async fn lock(&self, queues: &[MessageQueue]) -> Vec<MessageQueue> {
        let mut locked = Vec::new();
        for (addr, group) in self.by_broker(queues) {
            match self.core.lock_queues(&addr, self.group(), &group).await {
                Ok(ok) => locked.extend(ok),
                Err(error) => tracing::warn!(%addr, %error, "queue lock failed"),
            }
        }
        locked
    }

    async fn unlock(&self, queues: &[MessageQueue]) {
        for (addr, group) in self.by_broker(queues) {
            if let Err(error) = self.core.unlock_queues(&addr, self.group(), &group).await {
                tracing::debug!(%addr, %error, "queue unlock failed");
            }
        }
    }

    fn by_broker(&self, queues: &[MessageQueue]) -> BTreeMap<String, Vec<MessageQueue>> {
        let mut grouped: BTreeMap<String, Vec<MessageQueue>> = BTreeMap::new();
        for queue in queues {
            if let Ok(addr) = self.core.broker_addr(&queue.broker_name) {
                grouped.entry(addr).or_default().push(queue.clone());
            }
        }
        grouped
    }

    /// Waits until the queue has room again; false when the queue was stopped.
    async fn wait_for_room(&self, state: &QueueState, stop: &mut watch::Receiver<bool>) -> bool {
        loop {
            let freed = state.space_freed.notified();
            {
                let pq = state.process_queue.lock();
                if pq.is_dropped() {
                    return false;
                }
                if pq.message_count() < self.config.max_in_flight_messages_per_queue
                    && pq.bytes_in_flight() < self.config.max_in_flight_bytes_per_queue
                {
                    return true;
                }
            }
            tokio::select! {
                _ = freed => {}
                _ = stop.changed() => return false,
            }
        }
    }

    async fn pull_loop(self: Arc<Self>, state: Arc<QueueState>, start: QueueOffset) {
        let mut stop = state.stop.subscribe();
        let Some(subscription) = self
            .subscriptions
            .iter()
            .find(|s| s.topic == state.queue.topic)
            .cloned()
        else {
            return;
        };
        let mut next = start;
        loop {
            if *stop.borrow() || !self.wait_for_room(&state, &mut stop).await {
                return;
            }
            let commit_offset = self.offsets.read(&state.queue).filter(|o| o.0 > 0);
            // Never ask for more than the room left, so the message limit is a hard cap.
            let room = self
                .config
                .max_in_flight_messages_per_queue
                .saturating_sub(state.process_queue.lock().message_count());
            let max_messages = self
                .config
                .pull_batch_size
                .min(u32::try_from(room).unwrap_or(u32::MAX))
                .max(1);
            let spec = PullSpec {
                group: self.group(),
                queue: &state.queue,
                offset: next,
                max_messages,
                subscription: &subscription,
                commit_offset,
                suspend: Some(self.config.long_poll),
            };
            let pulled = tokio::select! {
                pulled = self.core.pull(&spec) => pulled,
                _ = stop.changed() => return,
            };
            let result = match pulled {
                Ok(result) => result,
                Err(error) => {
                    tracing::debug!(queue = %state.queue, %error, "pull failed; backing off");
                    tokio::select! {
                        _ = tokio::time::sleep(self.config.retry_pause) => continue,
                        _ = stop.changed() => return,
                    }
                }
            };
            match result.status {
                PullStatus::Found(messages) => {
                    next = result.next_begin_offset;
                    match self.config.mode {
                        ConsumeMode::Concurrent => self.dispatch_concurrently(&state, messages),
                        ConsumeMode::Orderly => {
                            state.process_queue.lock().put_messages(
                                messages
                                    .into_iter()
                                    .map(|m| (m.queue_offset, m.size_bytes, m)),
                            );
                            if !self.consume_orderly(&state, &mut stop).await {
                                return;
                            }
                        }
                    }
                }
                PullStatus::NoNewMessage | PullStatus::NoMatchedMessage => {
                    next = result.next_begin_offset.max(next);
                    // Nothing in flight: everything before `next` is consumed (or filtered out).
                    if state.process_queue.lock().message_count() == 0 {
                        self.offsets
                            .update(&state.queue, next, UpdateMode::IncreaseOnly);
                    }
                }
                PullStatus::OffsetIllegal => {
                    tracing::warn!(queue = %state.queue, from = %next, to = %result.next_begin_offset, "offset out of range; moving");
                    next = result.next_begin_offset;
                    self.offsets
                        .update(&state.queue, next, UpdateMode::Overwrite);
                    if let Err(error) = self.persist_offset(&state.queue).await {
                        tracing::warn!(queue = %state.queue, %error, "could not commit the corrected offset");
                    }
                }
            }
        }
    }

    fn dispatch_concurrently(
        self: &Arc<Self>,
        state: &Arc<QueueState>,
        messages: Vec<ReceivedMessage>,
    ) {
        let fresh: Vec<ReceivedMessage> = {
            let mut pq = state.process_queue.lock();
            let mut fresh = Vec::with_capacity(messages.len());
            for message in messages {
                if pq.put_messages([(message.queue_offset, message.size_bytes, message.clone())])
                    == 1
                {
                    fresh.push(message);
                }
            }
            fresh
        };
        for batch in fresh.chunks(self.config.consume_batch_size) {
            tokio::spawn(self.clone().consume_batch(state.clone(), batch.to_vec()));
        }
    }

    async fn call_listener(&self, batch: Arc<[ReceivedMessage]>) -> ConsumeOutcome {
        let listener = self.listener.clone();
        match tokio::task::spawn_blocking(move || listener(&batch)).await {
            Ok(outcome) => outcome,
            Err(join_error) => {
                // A panicking listener counts as a failed batch, as an exception does in Java.
                tracing::error!(%join_error, "listener panicked");
                ConsumeOutcome::Retry
            }
        }
    }

    /// Boxed because a failed batch schedules itself again (a recursive future).
    fn consume_batch(
        self: Arc<Self>,
        state: Arc<QueueState>,
        batch: Vec<ReceivedMessage>,
    ) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let Ok(_permit) = self.consume_permits.clone().acquire_owned().await else {
                return;
            };
            // Not started before the stop: leave it for the next owner of the queue.
            if state.is_dropped() || state.is_stopping() {
                return;
            }
            let batch: Arc<[ReceivedMessage]> = batch.into();
            let outcome = self.call_listener(batch.clone()).await;
            let mut consumed: Vec<QueueOffset> = batch.iter().map(|m| m.queue_offset).collect();
            let mut again = Vec::new();
            if outcome == ConsumeOutcome::Retry {
                // Sent back = consumed here; the broker redelivers it through %RETRY%group.
                for message in batch.iter() {
                    let sent = self
                        .core
                        .send_back(
                            self.group(),
                            message,
                            SendBackTarget::Retry {
                                delay_level: self.config.retry_delay_level,
                            },
                            self.config.max_reconsume_times,
                        )
                        .await;
                    if let Err(error) = sent {
                        tracing::warn!(msg_id = %message.msg_id(), %error, "send-back failed; consuming again locally");
                        consumed.retain(|o| *o != message.queue_offset);
                        let mut retry = message.clone();
                        retry.reconsume_times += 1;
                        again.push(retry);
                    }
                }
            }
            let commit = state.process_queue.lock().remove_messages(&consumed);
            if let CommitPoint::Advance(offset) = commit {
                if !state.is_dropped() {
                    self.offsets
                        .update(&state.queue, offset, UpdateMode::IncreaseOnly);
                }
            }
            state.space_freed.notify_waiters();
            if !again.is_empty() && !state.is_dropped() {
                let pause = self.config.retry_pause;
                let inner = self.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(pause).await;
                    inner.consume_batch(state, again).await;
                });
            }
        })
    }

    /// Consumes everything pulled for this queue in order; false when the queue was stopped.
    async fn consume_orderly(
        &self,
        state: &Arc<QueueState>,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        loop {
            let batch: Vec<ReceivedMessage> = state
                .process_queue
                .lock()
                .take_messages(self.config.consume_batch_size)
                .into_iter()
                .map(|(_, m)| m)
                .collect();
            if batch.is_empty() {
                return true;
            }
            if state.is_dropped() || state.is_stopping() {
                state.process_queue.lock().return_taken();
                return false;
            }
            if !state.holds_lock() {
                // Another member may own the queue now: wait for the next lock renewal.
                state.process_queue.lock().return_taken();
                tokio::select! {
                    _ = tokio::time::sleep(self.config.retry_pause) => continue,
                    _ = stop.changed() => return false,
                }
            }
            let batch: Arc<[ReceivedMessage]> = batch.into();
            let outcome = {
                let _permit = self.consume_permits.acquire().await;
                self.call_listener(batch.clone()).await
            };
            let exhausted = batch
                .iter()
                .all(|m| m.reconsume_times + 1 >= self.config.max_reconsume_times);
            let done = match outcome {
                ConsumeOutcome::Success => true,
                ConsumeOutcome::Retry if exhausted && !batch.is_empty() => {
                    // Out of local attempts: park the batch in the DLQ and move on, as RocketMQ does.
                    let mut parked = true;
                    for message in batch.iter() {
                        let max = self.config.max_reconsume_times;
                        if let Err(error) = self
                            .core
                            .send_back(self.group(), message, SendBackTarget::DeadLetter, max)
                            .await
                        {
                            tracing::warn!(msg_id = %message.msg_id(), %error, "could not park an exhausted message");
                            parked = false;
                        }
                    }
                    parked
                }
                ConsumeOutcome::Retry => false,
            };
            if done {
                let commit = state.process_queue.lock().commit_taken();
                if let CommitPoint::Advance(offset) = commit {
                    self.offsets
                        .update(&state.queue, offset, UpdateMode::IncreaseOnly);
                }
                state.space_freed.notify_waiters();
                continue;
            }
            state
                .process_queue
                .lock()
                .return_taken_with(|m| m.reconsume_times += 1);
            tokio::select! {
                _ = tokio::time::sleep(self.config.retry_pause) => {}
                _ = stop.changed() => return false,
            }
        }
    }
}
