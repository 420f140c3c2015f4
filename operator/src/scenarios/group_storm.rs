//! No reconcile storm under the real controller: against the test API server (list, watch,
//! resourceVersions), a group whose lag changes all the time is polled and its status written
//! once per lag interval over ten simulated minutes, however its own status writes come back
//! through the watch.

use super::addr;
use crate::controller::{self, Context};
use crate::crd::{Broker, ConsumerGroup};
use crate::fixtures::{BrokerFixture, FakeAdmin, GroupFixture};
use crate::testapi::{sim_clock, TestApiServer};
use std::sync::Arc;
use std::time::Duration;

const LAG_INTERVAL: Duration = Duration::from_secs(15);
const TEN_MINUTES: Duration = Duration::from_secs(600);

/// Reconciles of the ConsumerGroup controller so far, from the operator's own counter.
fn group_reconciles(ctx: &Context) -> u64 {
    let prefix = r#"quiver_reconcile_total{controller="consumergroup"} "#;
    ctx.metrics
        .encode()
        .lines()
        .find_map(|line| line.strip_prefix(prefix))
        .map_or(0, |count| count.parse().expect("a count"))
}

/// Producers outpace the consumer: every simulated second, two messages stored, one consumed.
fn start_traffic(admin: Arc<FakeAdmin>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for second in 0u64.. {
            admin.set_queue(
                &addr(0),
                "billing",
                ("orders", 0),
                100 + 2 * second,
                Some(second),
                Some(crate::testapi::SIM_EPOCH_MS),
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_lagging_group_is_polled_and_written_once_per_interval() {
    let server = TestApiServer::start().await;
    let admin = Arc::new(FakeAdmin::default());
    admin.set_members(&addr(0), "billing", &["10.0.0.7@1"]);
    let traffic = start_traffic(admin.clone());
    let mut broker = Broker::test();
    broker.metadata.uid = None;
    server.insert(&broker);
    let mut group = ConsumerGroup::test();
    group.metadata.uid = None;
    server.insert(&group);
    let ctx = Arc::new(
        Context::new(server.client(), admin.clone(), Arc::default(), LAG_INTERVAL)
            .with_clock(sim_clock),
    );
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(controller::run(ctx.clone(), Some("ns".into()), async {
        stopped.await.ok();
    }));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let writes_before = server.request_count("patch", "consumergroups", "billing", "status");
    let reconciles_before = group_reconciles(&ctx);

    tokio::time::sleep(TEN_MINUTES).await;
    let intervals = (TEN_MINUTES.as_secs() / LAG_INTERVAL.as_secs()) as usize;
    let writes =
        server.request_count("patch", "consumergroups", "billing", "status") - writes_before;
    // The lag differs at every poll, so each poll writes once: writes count the polls.
    assert!(
        (intervals - 2..=intervals + 1).contains(&writes),
        "{writes} status writes in {intervals} intervals"
    );
    let reconciles = group_reconciles(&ctx) - reconciles_before;
    assert!(
        reconciles <= 2 * intervals as u64 + 2,
        "{reconciles} reconciles in {intervals} intervals: at most the poll and one wake by its write"
    );
    let status = server
        .object::<ConsumerGroup>("ns", "billing")
        .and_then(|group| group.status)
        .expect("status");
    assert!(status.total_lag.unwrap_or(0) > 600, "{status:?}");
    stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(30), operator)
        .await
        .expect("the operator stops")
        .expect("joins");
    traffic.abort();
}
