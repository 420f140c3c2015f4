//! What the group scenarios share: a context on simulated time, a Broker of two brokers, and
//! polls that play the watch and the requeue timer.

use super::{stored_group, LAG_INTERVAL, NOW_MS};
use crate::controller::group::reconcile;
use crate::controller::Context;
use crate::crd::{Broker, BrokerStatus};
use crate::fixtures::{
    advance_simulated_clock, paths, set_simulated_now, simulated_clock, BrokerFixture,
    FakeApiServer,
};
use kube::runtime::controller::Action;
use kube::Client;
use std::sync::Arc;

/// A context whose clock is the simulated one, starting at [`NOW_MS`].
pub fn simulated_context(
    client: Client,
    admin: Arc<dyn crate::admin::BrokerAdmin>,
) -> Arc<Context> {
    set_simulated_now(NOW_MS);
    Arc::new(Context::new(client, admin, Arc::default(), LAG_INTERVAL).with_clock(simulated_clock))
}

/// Broker `qb` with two brokers running.
pub fn two_brokers(api: &FakeApiServer) {
    let broker = Broker::test().replicas(2).with_status(BrokerStatus {
        current_replicas: 2,
        ..BrokerStatus::default()
    });
    api.insert(&paths::broker("qb"), &broker);
}

/// Status writes of group `billing` so far.
pub fn status_writes(api: &FakeApiServer) -> usize {
    let path = format!("PATCH {}/status", paths::group("billing"));
    api.requests()
        .iter()
        .filter(|request| **request == path)
        .count()
}

/// Lag polls so far: each one reads the Broker first.
pub fn polls(api: &FakeApiServer) -> usize {
    let path = format!("GET {}", paths::broker("qb"));
    api.requests()
        .iter()
        .filter(|request| **request == path)
        .count()
}

/// Reconciles the stored group as the controller would: again at once after each status write
/// (an unfiltered watch of our own object), until a reconcile writes nothing. The last result.
pub async fn reconcile_until_quiet(
    api: &FakeApiServer,
    ctx: &Arc<Context>,
) -> Result<Action, crate::Error> {
    for _ in 0..10 {
        let before = status_writes(api);
        let result = reconcile(Arc::new(stored_group(api)), ctx.clone()).await;
        if status_writes(api) == before || result.is_err() {
            return result;
        }
    }
    panic!("a status write woke a reconcile that wrote again, 10 times over: a storm");
}

/// Moves simulated time by `by`, then polls as the requeue timer would.
pub async fn poll_after(
    api: &FakeApiServer,
    ctx: &Arc<Context>,
    by: std::time::Duration,
) -> Result<Action, crate::Error> {
    advance_simulated_clock(by);
    reconcile_until_quiet(api, ctx).await
}
