//! Tasks that run beside the connections until shutdown, most of them one round every so
//! often: [`Background::spawn_periodic`] holds the tick, the stop, the master-only gate and
//! the logging of rounds that fail, so a loop says only what one round does.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::error::FailureLog;

/// How a round went: `Continue(None)` worked, `Continue(Some(error))` failed and is logged
/// when the failure starts, changes and ends; `Break` ends the loop (its task failed).
pub(crate) type Flow = ControlFlow<(), Option<String>>;

/// One round of a periodic loop. A closure returning a future is one; a loop with state
/// between rounds implements it on that state.
pub(crate) trait Round: Send + 'static {
    fn round(&mut self) -> impl Future<Output = Flow> + Send + '_;
}

impl<F, Fut> Round for F
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = Flow> + Send + 'static,
{
    fn round(&mut self) -> impl Future<Output = Flow> + Send + '_ {
        self()
    }
}

/// Whether a round may run now (a master-only loop's: whether this broker takes writes).
pub(crate) type Gate = Arc<dyn Fn() -> bool + Send + Sync>;

/// The background tasks and the stop signal they share.
pub(crate) struct Background {
    tasks: JoinSet<()>,
    stop: watch::Receiver<bool>,
    /// Asked before each round of a master-only loop (whether this broker takes writes);
    /// set once the broker has opened.
    takes_writes: Option<Gate>,
}

impl Background {
    pub(crate) fn new(stop: watch::Receiver<bool>) -> Background {
        Background {
            tasks: JoinSet::new(),
            stop,
            takes_writes: None,
        }
    }

    /// What master-only loops ask before each round: whether this broker takes writes.
    pub(crate) fn gate_master_only(&mut self, takes_writes: Gate) {
        self.takes_writes = Some(takes_writes);
    }

    pub(crate) fn stop(&self) -> watch::Receiver<bool> {
        self.stop.clone()
    }

    /// Runs a task until it ends (it watches [`Background::stop`] itself).
    pub(crate) fn spawn(&mut self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks.spawn(task);
    }

    /// Runs `round` every `every` (the first at once) until the stop; a `master_only` loop
    /// skips its rounds while the broker takes no writes (a group's replica). `name` says
    /// what the rounds do in the log of their failures.
    pub(crate) fn spawn_periodic(
        &mut self,
        name: &'static str,
        every: Duration,
        master_only: bool,
        round: impl Round,
    ) {
        let gate = if master_only {
            let gate = self.takes_writes.clone();
            assert!(
                gate.is_some(),
                "master-only loop {name} before the broker opened"
            );
            gate
        } else {
            None
        };
        self.tasks
            .spawn(periodic(name, every, gate, self.stop.clone(), round));
    }

    /// Waits until every task has ended.
    pub(crate) async fn join(&mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

/// The loop of [`Background::spawn_periodic`], for callers that run it themselves.
pub(crate) async fn periodic(
    name: &'static str,
    every: Duration,
    gate: Option<Gate>,
    mut stop: watch::Receiver<bool>,
    mut round: impl Round,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failures = FailureLog::default();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        if gate.as_ref().is_some_and(|takes_writes| !takes_writes()) {
            continue;
        }
        match round.round().await {
            ControlFlow::Continue(failure) => failures.record(name, failure),
            ControlFlow::Break(()) => {
                tracing::debug!(name, "periodic loop ended");
                return;
            }
        }
    }
}
