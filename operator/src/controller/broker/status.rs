//! The Broker's status, pure: what the plan drafted, finished with what the steps reported,
//! and the events its condition changes call for.

use super::execute::Outcome;
use super::{
    DISK_PRESSURE_REQUEUE, IDLE_REQUEUE, PROGRESS_REQUEUE, REASON_PROGRESS_DEADLINE,
    REASON_UNAVAILABLE,
};
use crate::controller::conditions::{self, Desired, Status};
use crate::controller::expansion::{self, Expansion};
use crate::controller::replication;
use crate::controller::rollout::{self, ProgressMarkers};
use crate::controller::{broker::Problem, drain};
use crate::crd::{
    Broker, BrokerAddress, BrokerReplicationStatus, BrokerStatus, DrainStatus,
    ReplicationGroupStatus, RestartState, RestartStatus, RolloutStatus,
};
use crate::desired::{self, RolloutPlan};
use crate::disk;
use k8s_openapi::api::apps::v1::StatefulSetStatus;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::events::EventType;
use std::time::Duration;

/// How many brokers run this pass, and the drain holding the leaving ones.
#[derive(Clone, Debug, PartialEq)]
pub struct Scale {
    /// spec.replicas' pods (at least one group).
    pub wanted: i32,
    /// Pods to run: above `wanted` while the drain holds.
    pub replicas: i32,
    /// The drain in progress.
    pub drain: Option<DrainStatus>,
    /// Brokers the status lists read-only.
    pub read_only: ReadOnly,
}

/// The brokers listed read-only: kept ones whose restore failed (unless the leaving brokers
/// were just released), then those draining.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadOnly {
    /// Whether kept brokers that stay read-only are listed.
    pub failed_restores: bool,
    /// The draining brokers.
    pub draining: Vec<String>,
}

impl ReadOnly {
    pub fn failed_restores() -> ReadOnly {
        ReadOnly::failed_restores_and(Vec::new())
    }

    pub fn failed_restores_and(draining: Vec<String>) -> ReadOnly {
        ReadOnly {
            failed_restores: true,
            draining,
        }
    }

    pub fn none() -> ReadOnly {
        ReadOnly {
            failed_restores: false,
            draining: Vec::new(),
        }
    }

    fn list(&self, still_read_only: &[String]) -> Vec<String> {
        let failed = still_read_only.iter().filter(|_| self.failed_restores);
        failed.chain(&self.draining).cloned().collect()
    }
}

/// Everything the status needs that the plan knows; the steps' outcome completes it.
#[derive(Clone, Debug, PartialEq)]
pub struct Draft {
    pub statefulset_exists: bool,
    pub sts_status: StatefulSetStatus,
    pub plan: RolloutPlan,
    pub scale: Scale,
    pub expansion: Expansion,
    pub disk: Desired,
    pub now: Timestamp,
    /// Each broker group's replication, with spec.replication only.
    pub replication: Option<Vec<ReplicationGroupStatus>>,
    /// A replicated Broker's pods are being restarted group by group.
    pub replicated_rolling: bool,
    /// The last restart asked for with the `quiver.io/restart` annotation, after this pass.
    pub restart: Option<RestartStatus>,
}

/// What the status says about the next pass.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outlook {
    pub progressing: bool,
    pub disk_pressure: bool,
    pub problems: bool,
    pub replication_degraded: bool,
}

impl Outlook {
    pub fn requeue(&self) -> Duration {
        if self.progressing || self.problems {
            PROGRESS_REQUEUE
        } else if self.disk_pressure || self.replication_degraded {
            DISK_PRESSURE_REQUEUE
        } else {
            IDLE_REQUEUE
        }
    }
}

/// The status of a paused Broker: Paused=True and Progressing=False; its other conditions are
/// not the pass's to decide and stay as stored ([`onto_stored`]).
pub fn paused_status(broker: &Broker, previous: BrokerStatus, now: Timestamp) -> BrokerStatus {
    let conditions = conditions::merge(
        &previous.conditions,
        &[
            Desired::new(
                "Paused",
                true,
                "PauseAnnotation",
                "reconciliation stopped by the quiver.io/paused annotation",
            ),
            Desired::new(
                "Progressing",
                false,
                "Paused",
                "changes are not applied while paused",
            ),
        ],
        broker.metadata.generation,
        now,
    );
    BrokerStatus {
        conditions,
        ..previous
    }
}

/// What went spec.progressDeadlineSeconds without progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Overdue {
    Nothing,
    /// A rollout or start: pods not updated or not Ready.
    Rollout,
    /// A volume expansion: claims not resized.
    Expansion,
}

/// The condition types a running pass decides: one it no longer sets is removed.
pub const CONDITIONS: [&str; 7] = [
    "Ready",
    "Progressing",
    "Degraded",
    "Paused",
    disk::CONDITION,
    expansion::CONDITION,
    replication::CONDITION,
];

/// The status a pass writes over the `stored` one: every field as the pass computed it
/// (`ours`) but the conditions, where the types `ours` sets or `drops` names are the pass's
/// and every other stored condition (another writer's) is kept ([`conditions::rebase`]).
pub fn onto_stored(
    ours: &BrokerStatus,
    drops: &[&str],
    stored: Option<&BrokerStatus>,
    now: Timestamp,
) -> BrokerStatus {
    let stored = stored.map(|status| status.conditions.as_slice());
    let decides =
        |type_: &str| drops.contains(&type_) || conditions::find(&ours.conditions, type_).is_some();
    BrokerStatus {
        conditions: conditions::rebase(stored.unwrap_or_default(), &ours.conditions, decides, now),
        ..ours.clone()
    }
}

/// The pass's view for the conditions: the draft with the outcome folded in.
struct Finished<'a> {
    draft: &'a Draft,
    expansion: Expansion,
    problems: &'a [Problem],
}

impl Draft {
    /// The status once the steps ran, and what it says about the next pass: pure.
    pub fn finish(
        &self,
        broker: &Broker,
        previous: &BrokerStatus,
        outcome: &Outcome,
    ) -> (BrokerStatus, Outlook) {
        let mut expansion = self.expansion.clone();
        if let Some(rejected) = &outcome.claims_rejected {
            expansion.condition = Some(rejected.clone());
        }
        let finished = Finished {
            draft: self,
            expansion,
            problems: &outcome.problems,
        };
        let ready = self.sts_status.ready_replicas.unwrap_or(0);
        let rolling = self.plan.partition > 0 || self.replicated_rolling;
        let rollout = rolling.then(|| RolloutStatus {
            partition: self.plan.partition,
            updated_replicas: self.sts_status.updated_replicas.unwrap_or(0),
        });
        let markers = ProgressMarkers {
            generation: broker.metadata.generation,
            ready,
            replicas: self.plan.replicas,
            rollout: rollout.as_ref().map(|r| (r.partition, r.updated_replicas)),
            resized_claims: finished
                .expansion
                .storage
                .as_ref()
                .map(|s| s.resized_claims),
        };
        let last_progress = rollout::last_progress(previous, &markers, self.now);
        let deadline_s = broker.spec.progress_deadline_seconds;
        let deadline_passed = self.scale.drain.is_none()
            && rollout::deadline_exceeded(last_progress, self.now, deadline_s);
        let overdue = if deadline_passed && (rolling || ready < self.plan.replicas) {
            Overdue::Rollout
        } else if deadline_passed && finished.expansion.in_progress() {
            Overdue::Expansion
        } else {
            Overdue::Nothing
        };
        let (desired_conditions, outlook) = finished.conditions(broker, ready, overdue, deadline_s);
        let status = BrokerStatus {
            observed_generation: broker.metadata.generation,
            ready_replicas: ready,
            current_replicas: self.plan.replicas,
            replicas: desired::groups_of_pods(broker, self.plan.replicas),
            label_selector: Some(desired::pod_selector(broker)),
            brokers: (0..self.plan.replicas)
                .map(|ordinal| BrokerAddress {
                    name: desired::pod_name(broker, ordinal),
                    address: desired::broker_address(broker, ordinal),
                })
                .collect(),
            conditions: conditions::merge(
                &previous.conditions,
                &desired_conditions,
                broker.metadata.generation,
                self.now,
            ),
            read_only_brokers: self.scale.read_only.list(&outcome.still_read_only),
            last_progress_time: Some(last_progress.to_string()),
            drain: self.scale.drain.clone(),
            rollout,
            storage: finished.expansion.storage.clone(),
            replication: self
                .replication
                .clone()
                .map(|groups| BrokerReplicationStatus { groups }),
            restart: self.restart.clone(),
        };
        (status, outlook)
    }
}

impl Finished<'_> {
    /// The conditions to set, and the outlook they give.
    fn conditions(
        &self,
        broker: &Broker,
        ready: i32,
        overdue: Overdue,
        deadline_s: i64,
    ) -> (Vec<Desired>, Outlook) {
        let draft = self.draft;
        let wanted = draft.scale.wanted;
        let progressing = self.progressing(ready);
        let degraded = self.degraded(overdue, deadline_s);
        let (holds, reason) = if ready >= wanted {
            (true, "AllBrokersReady")
        } else {
            (false, "BrokersNotReady")
        };
        let ready_condition = Desired::new(
            "Ready",
            holds,
            reason,
            format!("{ready}/{wanted} brokers ready"),
        );
        let replication_condition = draft
            .replication
            .as_ref()
            .map(|groups| replication::condition(broker, groups));
        let outlook = Outlook {
            progressing: progressing.status == Status::True,
            disk_pressure: draft.disk.status == Status::True,
            problems: !self.problems.is_empty(),
            replication_degraded: replication_condition
                .as_ref()
                .is_some_and(|condition| condition.status == Status::True),
        };
        let mut desired = vec![
            ready_condition,
            progressing,
            degraded,
            Desired::new("Paused", false, "NotPaused", "reconciling"),
            draft.disk.clone(),
        ];
        desired.extend(self.expansion.condition.clone());
        desired.extend(replication_condition);
        (desired, outlook)
    }

    /// The Progressing condition: the first of draining, rolling, expanding, starting.
    fn progressing(&self, ready: i32) -> Desired {
        let draft = self.draft;
        let plan = &draft.plan;
        let (holds, reason, message) = if let Some(drain) = &draft.scale.drain {
            (
                true,
                "Draining",
                format!(
                    "waiting for the leaving brokers to be read: {}",
                    drain::describe(drain)
                ),
            )
        } else if let Some(restart) = draft
            .restart
            .as_ref()
            .filter(|restart| restart.state == RestartState::InProgress)
        {
            (
                true,
                "Restarting",
                format!(
                    "restart {} (quiver.io/restart): pods restart one at a time",
                    restart.token
                ),
            )
        } else if draft.replicated_rolling {
            (
                true,
                "RollingUpdate",
                "broker groups restart one pod at a time: replicas first, then the master \
                 after a switchover"
                    .to_string(),
            )
        } else if plan.partition > 0 {
            (
                true,
                "RollingUpdate",
                format!("pods from ordinal {} run the new template", plan.partition),
            )
        } else if self.expansion.in_progress() {
            (
                true,
                "ExpandingVolumes",
                "volume claims are being resized".to_string(),
            )
        } else if ready < plan.replicas {
            (
                true,
                "BrokersStarting",
                format!("{ready}/{} brokers ready", plan.replicas),
            )
        } else {
            (
                false,
                "Stable",
                "every broker runs the current spec".to_string(),
            )
        };
        Desired::new("Progressing", holds, reason, message)
    }

    /// The Degraded condition: the pass's problems first, then the progress deadline, then
    /// brokers not Ready although every pod runs the spec.
    fn degraded(&self, overdue: Overdue, deadline_s: i64) -> Desired {
        let draft = self.draft;
        let ready = draft.sts_status.ready_replicas.unwrap_or(0);
        let replicas = draft.plan.replicas;
        if let Some(first) = self.problems.first() {
            let messages: Vec<&str> = self.problems.iter().map(|p| p.message.as_str()).collect();
            return Desired::new("Degraded", true, first.reason, messages.join("; "));
        }
        if overdue == Overdue::Expansion {
            let message = self.expansion.overdue_message(deadline_s);
            return Desired::new("Degraded", true, REASON_PROGRESS_DEADLINE, message);
        }
        if overdue == Overdue::Rollout {
            let message = format!(
                "no progress for more than {deadline_s}s (spec.progressDeadlineSeconds): \
                 {ready}/{replicas} brokers ready, pods from ordinal {} at the new template; a \
                 pod not Ready at the new template needs a spec fix",
                draft.plan.partition
            );
            return Desired::new("Degraded", true, REASON_PROGRESS_DEADLINE, message);
        }
        let unavailable = draft.statefulset_exists
            && ready < replicas
            && draft.scale.drain.is_none()
            && draft.plan.partition == 0
            && !draft.replicated_rolling
            && draft.sts_status.updated_replicas.unwrap_or(0) >= replicas;
        let message = format!("{ready}/{} brokers ready", draft.scale.wanted);
        if unavailable {
            Desired::new("Degraded", true, REASON_UNAVAILABLE, message)
        } else {
            Desired::new("Degraded", false, "AsExpected", message)
        }
    }
}
/// Warning events for what newly went wrong, Normal ones for what recovered: only on change, so
/// a condition that holds does not repeat its event every pass.
pub fn transition_events(
    previous: &[Condition],
    next: &[Condition],
    problems: &[Problem],
) -> Vec<(EventType, String, String)> {
    let mut events = Vec::new();
    let before = |type_: &str| conditions::find(previous, type_);
    let after = |type_: &str| conditions::find(next, type_);
    if let Some(now) = after("Degraded").filter(|c| c.status == "True") {
        let was = before("Degraded").filter(|c| c.status == "True");
        if problems.is_empty() {
            if was.is_none_or(|was| was.reason != now.reason) {
                events.push((EventType::Warning, now.reason.clone(), now.message.clone()));
            }
        } else {
            for problem in problems {
                if was.is_none_or(|was| !was.message.contains(&problem.message)) {
                    events.push((
                        EventType::Warning,
                        problem.reason.to_string(),
                        problem.message.clone(),
                    ));
                }
            }
        }
    }
    if let Some(now) = after(expansion::CONDITION).filter(|c| c.status == "False") {
        let same = before(expansion::CONDITION).is_some_and(|was| {
            was.status == now.status && was.reason == now.reason && was.message == now.message
        });
        if !same {
            events.push((EventType::Warning, now.reason.clone(), now.message.clone()));
        }
    }
    let replication_was = before(replication::CONDITION).map(|c| c.status.as_str());
    if let Some(now) = after(replication::CONDITION) {
        match (replication_was == Some("True"), now.status.as_str()) {
            (false, "True") => events.push((
                EventType::Warning,
                replication::CONDITION.to_string(),
                now.message.clone(),
            )),
            (true, "False") => events.push((
                EventType::Normal,
                "ReplicationRecovered".to_string(),
                now.message.clone(),
            )),
            _ => {}
        }
    }
    let disk_was = before(disk::CONDITION).map(|c| c.status.as_str());
    if let Some(now) = after(disk::CONDITION) {
        match (disk_was == Some("True"), now.status.as_str()) {
            (false, "True") => events.push((
                EventType::Warning,
                disk::CONDITION.to_string(),
                now.message.clone(),
            )),
            (true, "False") => events.push((
                EventType::Normal,
                "DiskPressureRelieved".to_string(),
                now.message.clone(),
            )),
            _ => {}
        }
    }
    events
}
