//! The broker's background loops, each a round on [`Background::spawn_periodic`]:
//! persistence, client expiry, retention, deliveries (`crate::delivery`), POP revive, peer
//! polling, peers, ACL and TLS file reloads, and a group member's replication.

use std::future::Future;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use crate::broker::Broker;
use crate::periodic::{Background, Flow};

/// How often silent clients are looked for.
const CLIENT_SCAN_INTERVAL: Duration = Duration::from_secs(10);
/// How often retention looks for expired CommitLog segments, and for read ones to delete
/// early under disk pressure (Apache cleans every 10 s too).
const RETENTION_INTERVAL: Duration = Duration::from_secs(10);

/// How often a member that takes no writes applies what its state log gained.
const STATE_LOG_INTERVAL: Duration = Duration::from_millis(100);

/// The loops of an opened broker: persistence, client expiry, retention, delayed and timed
/// delivery, POP revive, transaction check-back, peer polling, peers and ACL file reloads and
/// a group member's replication.
pub(crate) fn spawn_broker_loops(background: &mut Background, broker: &Arc<Broker>) {
    replay_state_log(broker);
    let master = broker.clone();
    background.gate_master_only(Arc::new(move || master.takes_writes()));
    let config = broker.config();
    let persist_every = Duration::from_millis(config.persist_interval_ms);
    let check_every = Duration::from_millis(config.transaction_check_interval_ms);
    // On a full disk the offsets stay in memory and are written once there is room.
    let persisting = "periodic persist of offsets, topics and groups";
    background.spawn_periodic(persisting, persist_every, false, with(broker, persist));
    if broker.replication().is_some() {
        let records = crate::state_log::hook_pop_records(broker);
        let forwarding =
            crate::state_log::forward_pop_records(broker.clone(), records, background.stop());
        background.spawn(forwarding);
    }
    // A member that takes no writes applies the state log as its log grows.
    let following = with(broker, crate::state_log::follow_round);
    background.spawn_periodic(
        "applying the state log",
        STATE_LOG_INTERVAL,
        false,
        following,
    );
    let expiry = with(broker, expire_clients);
    background.spawn_periodic("expiring clients", CLIENT_SCAN_INTERVAL, false, expiry);
    let retention = with(broker, run_retention);
    background.spawn_periodic("retention", RETENTION_INTERVAL, false, retention);
    let delays = crate::delivery::delays::DelayDelivery::new(broker.clone());
    let delivering = "delivering scheduled messages";
    background.spawn_periodic(
        delivering,
        crate::delivery::delays::DelayDelivery::EVERY,
        true,
        delays,
    );
    background.spawn(crate::delivery::timers::run(
        broker.clone(),
        background.stop(),
    ));
    let revive = with(broker, crate::delivery::revive::round);
    let reviving = "reviving POP messages";
    background.spawn_periodic(reviving, crate::delivery::revive::EVERY, true, revive);
    let check_back = with(broker, crate::delivery::check_back::check_back_round);
    background.spawn_periodic("checking back half messages", check_every, true, check_back);
    // Always: a broker started alone gains peers when its config file lists some.
    spawn_peer_polls(background, broker);
    if broker.peers_file().is_some() {
        let reload = with(broker, reload_peers);
        let every = crate::peers::reload::RELOAD_POLL_INTERVAL;
        background.spawn_periodic("reloading the peers", every, false, reload);
    }
    if broker.acl().is_some() {
        let reload = with(broker, reload_acl);
        let every = crate::acl::RELOAD_POLL_INTERVAL;
        background.spawn_periodic("reloading the ACL file", every, false, reload);
    }
    if let Some(replication) = &broker.replication() {
        let stop = background.stop();
        background.spawn(crate::replication::run(
            broker.clone(),
            replication.clone(),
            stop,
        ));
    }
}

/// Asks the peers for their state every [`crate::peers::POLL_INTERVAL`].
fn spawn_peer_polls(background: &mut Background, broker: &Arc<Broker>) {
    let config = broker.config();
    let credentials = config.peer_credentials().map(Arc::new);
    let tls = config.peer_tls();
    let broker = broker.clone();
    let every = crate::peers::POLL_INTERVAL;
    background.spawn_periodic("polling peers", every, false, move || {
        let (broker, credentials, tls) = (broker.clone(), credentials.clone(), tls.clone());
        async move {
            let own = broker.advertised();
            broker
                .peers()
                .poll_all(own, credentials.as_ref(), tls.as_ref())
                .await;
            ControlFlow::Continue(None)
        }
    });
}

/// Before the broker serves: applies the state log records its offset snapshot lacks (a
/// commit answered before a crash is there, not in the snapshot).
fn replay_state_log(broker: &Broker) {
    let tables = crate::state_log::Tables::of(broker);
    let replayed = crate::state_log::catch_up(broker.store(), &tables);
    match replayed {
        Ok(0) => {}
        Ok(records) => tracing::info!(records, "state log replayed past the offset snapshot"),
        Err(error) => {
            tracing::error!(error = %crate::error::chain(&error), "cannot replay the state log; offsets are the snapshot's")
        }
    }
}

/// Every round calls `round` with the broker.
fn with<F, Fut>(broker: &Arc<Broker>, round: F) -> impl FnMut() -> Fut + Send + 'static
where
    F: Fn(Arc<Broker>) -> Fut + Send + 'static,
    Fut: Future<Output = Flow> + Send + 'static,
{
    let broker = broker.clone();
    move || round(broker.clone())
}

async fn persist(broker: Arc<Broker>) -> Flow {
    let failure = match crate::broker::blocking(&broker, |broker| broker.persist_all()).await {
        Ok(Ok(())) => None,
        Ok(Err(error)) | Err(error) => Some(crate::error::chain(&error)),
    };
    ControlFlow::Continue(failure)
}

async fn expire_clients(broker: Arc<Broker>) -> Flow {
    let expiry_ms = broker.config().client_expiry_ms;
    broker.producers().expire(crate::now_ms(), expiry_ms);
    for group in broker.consumers().expire(crate::now_ms(), expiry_ms) {
        tracing::info!(group, "client expired without heartbeat");
        broker.consumers().notify_ids_changed(&group);
    }
    ControlFlow::Continue(None)
}

async fn run_retention(broker: Arc<Broker>) -> Flow {
    let ran = crate::broker::blocking(&broker, |broker| {
        broker
            .store()
            .run_retention(crate::now_ms(), broker.lowest_unread())
    })
    .await;
    match ran {
        Ok(Ok(report)) if !report.deleted_segments.is_empty() => tracing::info!(
            segments = report.deleted_segments.len(),
            queue_files = report.deleted_queue_files,
            min_physical_offset = %report.min_physical_offset,
            disk_used_ratio = report.disk_used_ratio,
            "retention deleted CommitLog segments"
        ),
        Ok(Ok(_)) => {}
        Ok(Err(error)) => {
            tracing::error!(error = %crate::error::chain(&error), "retention failed")
        }
        Err(error) => {
            tracing::error!(error = %crate::error::chain(&error), "retention task failed")
        }
    }
    ControlFlow::Continue(None)
}

async fn reload_acl(broker: Arc<Broker>) -> Flow {
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(acl) = &broker.acl() {
            acl.reload_if_changed();
        }
    })
    .await;
    ControlFlow::Continue(None)
}

async fn reload_peers(broker: Arc<Broker>) -> Flow {
    let _ = tokio::task::spawn_blocking(move || {
        if let Some(file) = broker.peers_file() {
            file.reload_if_changed(broker.peers());
        }
    })
    .await;
    ControlFlow::Continue(None)
}

/// Looks for changed certificate and key files every [`crate::tls::RELOAD_POLL_INTERVAL`].
pub(crate) fn spawn_tls_reload(background: &mut Background, tls: &Arc<crate::tls::TlsServer>) {
    let tls = tls.clone();
    let every = crate::tls::RELOAD_POLL_INTERVAL;
    background.spawn_periodic("reloading TLS files", every, false, move || {
        let tls = tls.clone();
        async move {
            let _ = tokio::task::spawn_blocking(move || tls.reload_if_changed()).await;
            ControlFlow::Continue(None)
        }
    });
}
