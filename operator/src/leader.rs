//! Leader election on a coordination.k8s.io/v1 Lease (kube-lease-manager): the controllers run
//! only while this replica holds the lease.

use futures::future::BoxFuture;
use futures::FutureExt;
use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use std::future::Future;
use tokio::sync::watch;

/// Name of the Lease the operator replicas compete for.
pub const LEASE_NAME: &str = "quiver-operator-leader";
/// Seconds a lease stays valid after its last renewal.
pub const LEASE_DURATION_SECONDS: u64 = 15;
/// Seconds before expiry the holder renews.
pub const LEASE_GRACE_SECONDS: u64 = 5;

/// Failures of the election itself.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The Lease could not be read or created.
    #[error("cannot prepare Lease {namespace}/{lease}")]
    Prepare {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        lease: String,
        /// The lease manager error.
        #[source]
        source: LeaseManagerError,
    },
    /// The background renewal task ended before we became leader.
    #[error("the lease manager stopped while waiting for leadership")]
    ManagerStopped,
}

/// How leading ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// `stop` resolved: a clean shutdown (before or while leading).
    Stopped,
    /// Another replica took the lease: the caller should exit and compete again.
    Lost,
}

/// Who competes, for which Lease.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Unique identity of this replica (the pod name).
    pub identity: String,
}

/// Waits for the lease, then runs `lead(shutdown)` until `stop` resolves or the lease is lost;
/// `shutdown` resolves in both cases so the controllers stop gracefully. Releases the lease.
pub async fn run_while_leading<Lead, LeadFut>(
    client: Client,
    candidate: Candidate,
    stop: impl Future<Output = ()> + Send + 'static,
    lead: Lead,
) -> Result<Leadership, LeaderError>
where
    Lead: FnOnce(BoxFuture<'static, ()>) -> LeadFut,
    LeadFut: Future<Output = ()>,
{
    let manager = LeaseManagerBuilder::new(client, LEASE_NAME)
        .with_namespace(&candidate.namespace)
        .with_identity(&candidate.identity)
        .with_duration(LEASE_DURATION_SECONDS)
        .with_grace(LEASE_GRACE_SECONDS)
        // One field manager per candidate: taking an orphaned Lease relies on the apply of a
        // second taker conflicting, which a manager shared by every replica never does.
        .with_field_manager(format!("quiver-operator-{}", candidate.identity))
        .build()
        .await
        .map_err(|source| LeaderError::Prepare {
            namespace: candidate.namespace.clone(),
            lease: LEASE_NAME.to_string(),
            source,
        })?;
    let (mut leading, lease_task) = manager.watch().await;
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        stop.await;
        stop_tx.send(true).ok();
    });
    let stopped = |mut receiver: watch::Receiver<bool>| async move {
        receiver.wait_for(|stopped| *stopped).await.ok();
    };

    tracing::info!(identity = %candidate.identity, lease = LEASE_NAME, namespace = %candidate.namespace, "waiting for leadership");
    let became_leader = tokio::select! {
        result = leading.wait_for(|leader| *leader) => result.is_ok(),
        () = stopped(stop_rx.clone()) => false,
    };
    let outcome = if *stop_rx.borrow() {
        Leadership::Stopped
    } else if !became_leader {
        return Err(LeaderError::ManagerStopped);
    } else {
        tracing::info!(identity = %candidate.identity, "leading");
        let mut lost_rx = leading.clone();
        let lost = async move {
            lost_rx.wait_for(|leader| !*leader).await.ok();
        };
        let stop_signal = stopped(stop_rx.clone());
        let shutdown = async move {
            tokio::select! {
                () = lost => {},
                () = stop_signal => {},
            }
        }
        .boxed();
        lead(shutdown).await;
        if *stop_rx.borrow() {
            Leadership::Stopped
        } else {
            Leadership::Lost
        }
    };
    // Closing the channel ends the renewal task, which hands the manager back for release.
    drop(leading);
    if let Ok(Ok(manager)) = lease_task.await {
        if let Err(error) = manager.release().await {
            tracing::warn!(%error, "could not release the lease; it expires on its own");
        }
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testapi::TestApiServer;
    use k8s_openapi::api::coordination::v1::Lease;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// The holder of the operator's Lease in namespace `ops`, as the API server stores it.
    fn holder(server: &TestApiServer) -> serde_json::Value {
        let lease = server
            .raw::<Lease>("ops", "quiver-operator-leader")
            .expect("lease exists");
        lease["spec"]["holderIdentity"].clone()
    }

    #[tokio::test]
    async fn leads_until_stopped_then_releases_the_lease() {
        let server = Arc::new(TestApiServer::start().await);
        let led = Arc::new(AtomicBool::new(false));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let stop = async move {
            stop_rx.await.ok();
        };
        let candidate = Candidate {
            namespace: "ops".into(),
            identity: "operator-a".into(),
        };
        let lead_flag = led.clone();
        let server_in_lead = server.clone();
        let election = tokio::spawn(run_while_leading(
            server.client(),
            candidate,
            stop,
            move |shutdown| async move {
                lead_flag.store(true, Ordering::SeqCst);
                assert_eq!(holder(&server_in_lead), "operator-a");
                stop_tx.send(()).expect("election running");
                shutdown.await;
            },
        ));
        let outcome = tokio::time::timeout(Duration::from_secs(20), election)
            .await
            .expect("election ends within 20 s")
            .expect("task joins")
            .expect("election works");
        assert_eq!(outcome, Leadership::Stopped);
        assert!(led.load(Ordering::SeqCst), "controllers ran while leading");
        assert!(holder(&server).is_null(), "released");
    }

    #[tokio::test]
    async fn a_lease_held_by_another_replica_is_not_taken() {
        let server = TestApiServer::start().await;
        let renew = k8s_openapi::jiff::Timestamp::now().to_string();
        server.insert(&serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "quiver-operator-leader", "namespace": "ops"},
            "spec": {"holderIdentity": "operator-b", "leaseDurationSeconds": 3600, "acquireTime": renew, "renewTime": renew},
        }));
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let candidate = Candidate {
            namespace: "ops".into(),
            identity: "operator-a".into(),
        };
        let election = tokio::spawn(run_while_leading(
            server.client(),
            candidate,
            async move {
                stop_rx.await.ok();
            },
            |_shutdown| async { panic!("must not lead while operator-b holds the lease") },
        ));
        // Let the candidate read the lease a few times before stopping it.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        let lease_reads = || {
            server
                .requests()
                .iter()
                .filter(|request| request.verb == "get" && request.resource == "leases")
                .count()
        };
        while lease_reads() < 2 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the candidate never read the lease"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        stop_tx.send(()).expect("election running");
        let outcome = tokio::time::timeout(Duration::from_secs(20), election)
            .await
            .expect("election ends within 20 s")
            .expect("task joins")
            .expect("election works");
        assert_eq!(outcome, Leadership::Stopped);
        assert_eq!(holder(&server), "operator-b");
    }
}
