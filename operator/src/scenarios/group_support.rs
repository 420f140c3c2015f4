//! What the group scenarios share: the test API server with Broker `qb` of two brokers, the
//! in-memory brokers ([`FakeAdmin`]) and the real `controller::run` on namespace "ns", in
//! simulated time; readers of group `billing` as stored, its events and the request log.

use super::{addr, LAG_INTERVAL};
use crate::controller::group::FINALIZER;
use crate::controller::{self, Context};
use crate::crd::{Broker, ConsumerGroup, ConsumerGroupStatus};
use crate::fixtures::{BrokerFixture, FakeAdmin, GroupFixture};
use crate::testapi::{sim_clock, TestApiServer};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// One operator run: its context and how to stop it.
struct Operator {
    ctx: Arc<Context>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// The test API server, the brokers and (once started) an operator.
pub struct GroupScenario {
    pub server: TestApiServer,
    pub admin: Arc<FakeAdmin>,
    operator: Option<Operator>,
}

impl GroupScenario {
    /// Broker `qb` of two brokers stored, the operator running, no group yet.
    pub async fn start() -> GroupScenario {
        let mut scenario = GroupScenario::without_broker().await;
        scenario.create_broker();
        scenario.start_operator();
        scenario
    }

    /// [`GroupScenario::start`] with group billing's one queue (orders, 0) on the first broker
    /// at `broker_offset`, `committed` and the first unconsumed message `stored_at`, and one
    /// member connected.
    pub async fn with_one_queue(
        broker_offset: u64,
        committed: Option<u64>,
        stored_at: Option<i64>,
    ) -> GroupScenario {
        let scenario = GroupScenario::start().await;
        let admin = &scenario.admin;
        admin.set_queue(
            &addr(0),
            "billing",
            ("orders", 0),
            broker_offset,
            committed,
            stored_at,
        );
        admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
        scenario
    }

    /// The server and the brokers only: no Broker, no operator.
    pub async fn without_broker() -> GroupScenario {
        let server = TestApiServer::start().await;
        GroupScenario {
            server,
            admin: Arc::new(FakeAdmin::default()),
            operator: None,
        }
    }

    /// Creates Broker `qb` of two brokers, as a user would.
    pub fn create_broker(&self) {
        let mut broker = Broker::test().replicas(2);
        broker.metadata.uid = None;
        broker.metadata.generation = None;
        self.server.insert(&broker);
    }

    /// Starts an operator with a fresh context (nothing in memory), as a new leader would.
    pub fn start_operator(&mut self) {
        assert!(self.operator.is_none(), "one operator at a time");
        let ctx = Arc::new(
            Context::new(
                self.server.client(),
                self.admin.clone(),
                Arc::default(),
                LAG_INTERVAL,
            )
            .with_clock(sim_clock),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(controller::run(ctx.clone(), Some("ns".into()), async {
            stopped.await.ok();
        }));
        self.operator = Some(Operator { ctx, stop, task });
    }

    /// Stops the operator and waits for it within its shutdown grace.
    pub async fn stop_operator(&mut self) {
        let operator = self.operator.take().expect("an operator runs");
        operator.stop.send(()).ok();
        tokio::time::timeout(Duration::from_secs(30), operator.task)
            .await
            .expect("the operator stops")
            .expect("the operator task joins");
    }

    /// Stops everything.
    pub async fn stop(mut self) {
        if self.operator.is_some() {
            self.stop_operator().await;
        }
    }

    /// The running operator's context.
    pub fn ctx(&self) -> &Arc<Context> {
        &self.operator.as_ref().expect("an operator runs").ctx
    }

    /// The running operator's metrics, encoded.
    pub fn metrics(&self) -> String {
        self.ctx().metrics.encode()
    }

    /// Creates group `ns/billing` (topic orders, Broker qb), edited by `edit`, as a user would.
    pub fn create_group(&self, edit: impl FnOnce(&mut ConsumerGroup)) {
        let mut group = ConsumerGroup::test();
        group.metadata.uid = None;
        group.metadata.generation = None;
        edit(&mut group);
        self.server.insert(&group);
    }

    /// Edits the group as a user would (a spec change bumps the generation).
    pub fn edit_group(&self, edit: impl FnOnce(&mut Value)) {
        self.server.edit::<ConsumerGroup>("ns", "billing", edit);
    }

    /// The group as stored now, if it is.
    pub fn stored(&self) -> Option<ConsumerGroup> {
        self.server.object("ns", "billing")
    }

    /// The group as stored now.
    pub fn group(&self) -> ConsumerGroup {
        self.stored().expect("ConsumerGroup billing stored")
    }

    /// The group's status (default when none was written).
    pub fn status(&self) -> ConsumerGroupStatus {
        self.group().status.unwrap_or_default()
    }

    /// Status and reason of a condition of the group; empty strings when it has none.
    pub fn condition(&self, type_: &str) -> (String, String) {
        self.status()
            .conditions
            .iter()
            .find(|condition| condition.type_ == type_)
            .map(|found| (found.status.clone(), found.reason.clone()))
            .unwrap_or_default()
    }

    /// A condition's message; empty when the group has no such condition.
    pub fn message(&self, type_: &str) -> String {
        self.status()
            .conditions
            .iter()
            .find(|condition| condition.type_ == type_)
            .map(|found| found.message.clone())
            .unwrap_or_default()
    }

    /// True once the operator added its finalizer and wrote a status with Ready=True.
    pub fn polled(&self) -> bool {
        let Some(group) = self.stored() else {
            return false;
        };
        group.metadata.finalizers == Some(vec![FINALIZER.to_string()])
            && group.status.is_some_and(|status| {
                status
                    .conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True")
            })
    }

    /// Events about the ConsumerGroup, oldest first.
    pub fn events(&self) -> Vec<Value> {
        self.server
            .events()
            .into_iter()
            .filter(|event| {
                event["regarding"]["kind"] == "ConsumerGroup"
                    || event["involvedObject"]["kind"] == "ConsumerGroup"
            })
            .collect()
    }

    /// Reasons of the events about the ConsumerGroup, oldest first.
    pub fn event_reasons(&self) -> Vec<String> {
        self.events()
            .iter()
            .filter_map(|event| event["reason"].as_str().map(str::to_string))
            .collect()
    }

    /// The only event about the group with this reason, checked to be of `type_`.
    pub fn event(&self, reason: &str, type_: &str) -> Value {
        let events: Vec<Value> = self
            .events()
            .into_iter()
            .filter(|event| event["reason"] == reason)
            .collect();
        assert_eq!(
            events.len(),
            1,
            "one {reason} event in {:?}",
            self.event_reasons()
        );
        assert_eq!(events[0]["type"], type_, "{}", events[0]);
        events[0].clone()
    }

    /// Status writes of the group so far.
    pub fn status_writes(&self) -> usize {
        self.server
            .request_count("patch", "consumergroups", "billing", "status")
    }

    /// Lag polls so far: each one reads the Broker first (nothing else GETs it).
    pub fn polls(&self) -> usize {
        self.server.request_count("get", "brokers", "qb", "")
    }

    /// Group reconciles of the running operator, from its own counter.
    pub fn reconciles(&self) -> u64 {
        let prefix = r#"quiver_reconcile_total{controller="consumergroup"} "#;
        self.metrics()
            .lines()
            .find_map(|line| line.strip_prefix(prefix))
            .map_or(0, |count| count.parse().expect("a count"))
    }
}

/// How long the first poll of a new group may take, in simulated time.
pub const FIRST_POLL: Duration = Duration::from_secs(60);

/// The next poll after a change on the brokers: within an interval, plus request latency.
pub const NEXT_POLL: Duration = Duration::from_secs(LAG_INTERVAL.as_secs() + 10);

/// Remoting addresses of both brokers of `qb`.
pub fn both() -> [String; 2] {
    [addr(0), addr(1)]
}

/// The series of `quiver_lag_poll_success` of group billing.
pub const POLL_SUCCESS: &str =
    r#"quiver_lag_poll_success{namespace="ns",cluster="qb",consumer_group="billing"}"#;
