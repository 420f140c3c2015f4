//! Two full operators (leader election wrapping `controller::run`, each with its own context
//! and metrics) share one Lease: only the leader reconciles; when it stops, the other takes the
//! lease and reconciles the next change. The takeover waits out the lease in wall-clock time
//! (kube-lease-manager reads `SystemTime`): this scenario takes about LEASE_DURATION_SECONDS.

use super::{broker_reconciles, eventually, sim_context, SIM_PERIOD};
use crate::controller::{self, Context};
use crate::crd::Broker;
use crate::fixtures::{BrokerFixture, FakeAdmin};
use crate::leader::{run_while_leading, Candidate, Leadership, LEASE_DURATION_SECONDS, LEASE_NAME};
use crate::testapi::TestApiServer;
use k8s_openapi::api::coordination::v1::Lease;
use std::sync::Arc;
use std::time::Duration;

struct Operator {
    ctx: Arc<Context>,
    stop: tokio::sync::oneshot::Sender<()>,
    election: tokio::task::JoinHandle<Leadership>,
}

fn start_operator(server: &TestApiServer, identity: &str) -> Operator {
    let ctx = sim_context(server, Arc::new(FakeAdmin::default()));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let candidate = Candidate {
        namespace: "ns".into(),
        identity: identity.into(),
    };
    let lead_ctx = ctx.clone();
    let election = tokio::spawn(async move {
        let stop = async {
            stopped.await.ok();
        };
        run_while_leading(lead_ctx.client.clone(), candidate, stop, |shutdown| {
            controller::run(lead_ctx.clone(), Some("ns".into()), shutdown)
        })
        .await
        .expect("the election works")
    });
    Operator {
        ctx,
        stop,
        election,
    }
}

/// kube-lease-manager judges a lease it saw held by the wall clock (`SystemTime`), not tokio's:
/// the standby looks again only once LEASE_DURATION_SECONDS of real time passed since it last
/// read the lease. Waits that out (simulated time frozen by the blocking sleep) until it leads.
async fn wait_out_the_lease_in_wall_clock_time(server: &TestApiServer) {
    let started = std::time::Instant::now();
    let limit = Duration::from_secs(LEASE_DURATION_SECONDS * 2);
    loop {
        let lease = server
            .object::<Lease>("ns", LEASE_NAME)
            .and_then(|lease| lease.spec);
        if lease.and_then(|spec| spec.holder_identity).is_some() {
            return;
        }
        assert!(started.elapsed() < limit, "nobody took the released lease");
        tokio::task::spawn_blocking(|| std::thread::sleep(Duration::from_millis(500)))
            .await
            .expect("the real-time wait joins");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn broker_ready_at(server: &TestApiServer, generation: i64) -> bool {
    let Some(broker) = server.object::<Broker>("ns", "qb") else {
        return false;
    };
    let status = broker.status.unwrap_or_default();
    status.observed_generation == Some(generation) && status.ready_replicas == broker.spec.replicas
}

#[tokio::test(start_paused = true)]
async fn only_the_leader_reconciles_and_the_other_takes_over_when_it_stops() {
    let server = TestApiServer::start().await;
    server.add_storage_class("standard", true, true);
    server.run_controllers(SIM_PERIOD);
    let operators = [
        start_operator(&server, "operator-a"),
        start_operator(&server, "operator-b"),
    ];
    let mut broker = Broker::test().replicas(2).image("quiver:1");
    (broker.metadata.uid, broker.metadata.generation) = (None, None);
    server.insert(&broker);
    eventually(Duration::from_secs(300), || broker_ready_at(&server, 1)).await;
    // Several lease renewals later, still one reconciling.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let counts = operators
        .each_ref()
        .map(|operator| broker_reconciles(&operator.ctx));
    let leader = usize::from(counts[0] == 0);
    assert!(counts[leader] > 0, "the leader reconciles: {counts:?}");
    assert_eq!(
        counts[1 - leader],
        0,
        "the other never reconciles: {counts:?}"
    );

    let [first, second] = operators;
    let (leading, standby) = if leader == 0 {
        (first, second)
    } else {
        (second, first)
    };
    leading.stop.send(()).ok();
    let outcome = tokio::time::timeout(Duration::from_secs(30), leading.election)
        .await
        .expect("the leader stops")
        .expect("joins");
    assert_eq!(outcome, Leadership::Stopped);
    wait_out_the_lease_in_wall_clock_time(&server).await;
    server.edit::<Broker>("ns", "qb", |broker| broker["spec"]["replicas"] = 3.into());
    eventually(Duration::from_secs(300), || broker_ready_at(&server, 2)).await;
    assert!(broker_reconciles(&standby.ctx) > 0, "the standby took over");
    standby.stop.send(()).ok();
    tokio::time::timeout(Duration::from_secs(30), standby.election)
        .await
        .expect("the standby stops")
        .expect("joins");
}
