//! Broker reconciler: fetch, plan (drain, rollout), apply with server-side apply, write status.

use super::conditions::{self, is_true, Desired, Status};
use super::{object_key, patch_status, publish, Context, Error};
use crate::admin::{BrokerAddr, BrokerPermission, TopicConfig};
use crate::crd::{
    Broker, BrokerAddress, BrokerStatus, DrainStatus, RolloutStatus, StorageStatus,
    BROKER_DISK_HIGH_WATER_PERCENT,
};
use crate::desired::{self, RolloutPlan, FIELD_MANAGER, TEMPLATE_HASH_ANNOTATION};
use crate::disk::{self, BrokerDisk, DiskProbe};
use crate::lag::DrainProgress;
use crate::quantity::quantity_bytes;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::instrument;

/// Requeue delay while something is in progress (drain, rollout, expansion, startup).
pub const PROGRESS_REQUEUE: Duration = Duration::from_secs(10);
/// Requeue delay of a settled Broker (watches wake it earlier on changes).
pub const IDLE_REQUEUE: Duration = Duration::from_secs(300);
/// Requeue delay while DiskPressure is True, so the condition clears soon after the fix.
pub const DISK_PRESSURE_REQUEUE: Duration = Duration::from_secs(30);

/// Entry point of the Broker controller.
pub async fn reconcile(broker: Arc<Broker>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let result = reconcile_broker(&broker, &ctx).await;
    ctx.metrics.reconciled("broker", started.elapsed());
    if result.is_ok() {
        ctx.reset_backoff(&object_key(broker.as_ref()));
    }
    result
}

/// Where a rollout stands, from the existing StatefulSet and the new template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RolloutPhase {
    /// No StatefulSet yet: everything is created at the new template.
    Creating,
    /// The template changed: start updating from the highest ordinal.
    Started,
    /// The pod at the old partition is updated and all pods are Ready: move down one.
    Stepped,
    /// Waiting for the pod at the current partition to be updated and Ready.
    Waiting,
    /// Every pod runs the current template.
    Complete,
}

/// The StatefulSet plan for this pass: pure, from the Broker, the existing StatefulSet and the
/// replica count decided by the drain.
pub fn plan_rollout(
    broker: &Broker,
    existing: Option<&StatefulSet>,
    replicas: i32,
) -> (RolloutPlan, RolloutPhase) {
    let Some(existing) = existing else {
        return (
            RolloutPlan {
                replicas,
                ..RolloutPlan::initial(broker)
            },
            RolloutPhase::Creating,
        );
    };
    let spec = &existing.spec;
    // volumeClaimTemplates are immutable: keep what the StatefulSet was created with.
    let claim_size = spec
        .volume_claim_templates
        .as_ref()
        .and_then(|claims| claims.first())
        .and_then(|claim| claim.spec.as_ref())
        .and_then(|claim| claim.resources.as_ref())
        .and_then(|resources| resources.requests.as_ref())
        .and_then(|requests| requests.get("storage"))
        .map(|quantity| quantity.0.clone())
        .unwrap_or_else(|| broker.spec.storage.size.clone());
    let current_partition = spec
        .update_strategy
        .as_ref()
        .and_then(|strategy| strategy.rolling_update.as_ref())
        .and_then(|rolling| rolling.partition)
        .unwrap_or(0);
    let provisional = RolloutPlan {
        replicas,
        partition: 0,
        claim_size,
    };
    let new_hash = template_hash(&desired::stateful_set(broker, &provisional));
    let last_ordinal = (replicas - 1).max(0);
    if template_hash(existing) != new_hash {
        return (
            RolloutPlan {
                partition: last_ordinal,
                ..provisional
            },
            RolloutPhase::Started,
        );
    }
    let partition = current_partition.min(last_ordinal);
    if partition == 0 {
        return (provisional, RolloutPhase::Complete);
    }
    let status = existing.status.clone().unwrap_or_default();
    let status_is_current = status.observed_generation.is_some()
        && status.observed_generation >= existing.metadata.generation;
    let updated = status.updated_replicas.unwrap_or(0);
    let ready = status.ready_replicas.unwrap_or(0);
    if status_is_current && updated >= replicas - partition && ready >= replicas {
        (
            RolloutPlan {
                partition: partition - 1,
                ..provisional
            },
            RolloutPhase::Stepped,
        )
    } else {
        (
            RolloutPlan {
                partition,
                ..provisional
            },
            RolloutPhase::Waiting,
        )
    }
}

fn template_hash(statefulset: &StatefulSet) -> Option<String> {
    statefulset
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|metadata| metadata.annotations.as_ref())
        .and_then(|annotations| annotations.get(TEMPLATE_HASH_ANNOTATION))
        .cloned()
}

#[instrument(skip(broker, ctx), fields(broker = %broker.name_any()))]
async fn reconcile_broker(broker: &Broker, ctx: &Context) -> Result<Action, Error> {
    let missing = |field| Error::MissingField {
        kind: "Broker",
        name: broker.name_any(),
        field,
    };
    let namespace = broker.namespace().ok_or_else(|| missing("namespace"))?;
    // Owner references need the uid; the builders rely on it being there.
    broker.uid().ok_or_else(|| missing("uid"))?;
    let name = broker.name_any();
    let brokers: Api<Broker> = Api::namespaced(ctx.client.clone(), &namespace);
    let previous = broker.status.clone().unwrap_or_default();
    let now = Timestamp::from_millisecond((ctx.clock)()).unwrap_or(Timestamp::UNIX_EPOCH);

    if broker.is_paused() {
        if !is_true(&previous.conditions, "Paused") {
            publish(
                ctx,
                broker,
                EventType::Normal,
                "Paused",
                "Pause",
                "reconciliation paused by the quiver.io/paused annotation",
            )
            .await;
        }
        let mut conditions = conditions::merge(
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
        conditions.extend(
            previous
                .conditions
                .iter()
                .filter(|c| c.type_ != "Paused" && c.type_ != "Progressing")
                .cloned(),
        );
        let status = BrokerStatus {
            conditions,
            ..previous
        };
        patch_status(&brokers, &name, &status).await?;
        return Ok(Action::await_change());
    }

    let statefulsets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &namespace);
    let existing = statefulsets
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading StatefulSet {name}")))?;
    let wanted = broker.spec.replicas.max(1);
    let running = existing
        .as_ref()
        .and_then(|sts| sts.spec.replicas)
        .unwrap_or(0);

    let mut drain_status = None;
    let replicas = if existing.is_some() && wanted < running {
        let leaving: Vec<i32> = (wanted..running).collect();
        let progress = drain(broker, &leaving, ctx).await?;
        let leaving_names: Vec<String> = leaving
            .iter()
            .map(|ordinal| desired::pod_name(broker, *ordinal))
            .collect();
        if progress.is_drained() {
            let note = format!(
                "{} consumed to the end; scaling to {wanted}",
                leaving_names.join(", ")
            );
            publish(
                ctx,
                broker,
                EventType::Normal,
                "Drained",
                "ScaleDown",
                &note,
            )
            .await;
            wanted
        } else {
            if previous.drain.is_none() {
                let note = format!(
                    "{} read-only until every group consumed them",
                    leaving_names.join(", ")
                );
                publish(
                    ctx,
                    broker,
                    EventType::Normal,
                    "DrainStarted",
                    "ScaleDown",
                    &note,
                )
                .await;
            }
            drain_status = Some(DrainStatus {
                brokers: leaving_names,
                remaining_messages: progress.remaining_messages,
                pending_groups: progress.pending_groups,
            });
            running
        }
    } else {
        restore_cancelled_drain(broker, &previous, wanted, ctx).await?;
        wanted
    };

    let (plan, phase) = plan_rollout(broker, existing.as_ref(), replicas);
    match phase {
        RolloutPhase::Started if existing.is_some() => {
            let note = format!(
                "template changed; updating {} first",
                desired::pod_name(broker, plan.partition)
            );
            publish(
                ctx,
                broker,
                EventType::Normal,
                "RolloutStarted",
                "Rollout",
                &note,
            )
            .await;
        }
        RolloutPhase::Stepped => {
            let note = format!("updating {}", desired::pod_name(broker, plan.partition));
            publish(
                ctx,
                broker,
                EventType::Normal,
                "RolloutStep",
                "Rollout",
                &note,
            )
            .await;
        }
        _ => {}
    }

    let draining_from = drain_status.is_some().then_some(wanted);
    apply(
        ctx,
        &namespace,
        &desired::config_map(broker, plan.replicas, draining_from),
    )
    .await?;
    apply(ctx, &namespace, &desired::headless_service(broker)).await?;
    apply(ctx, &namespace, &desired::client_service(broker)).await?;
    apply(ctx, &namespace, &desired::pod_disruption_budget(broker)).await?;
    apply(ctx, &namespace, &desired::stateful_set(broker, &plan)).await?;

    let storage = if existing.is_some() {
        expand_volumes(broker, &namespace, &plan, ctx).await?
    } else {
        None
    };

    let sts_status = existing
        .as_ref()
        .and_then(|sts| sts.status.clone())
        .unwrap_or_default();
    let ready = sts_status.ready_replicas.unwrap_or(0);
    if !broker.spec.topics.is_empty() && ready >= plan.replicas {
        ensure_topics(broker, plan.replicas, ctx).await?;
    }

    let disks = if existing.is_some() {
        probe_disks(broker, plan.replicas, ctx).await
    } else {
        Vec::new()
    };
    let disk_condition = disk::disk_pressure(
        &disks,
        default_high_water(broker),
        &broker.spec.storage.size,
    );
    let disk_pressure = disk_condition.status == Status::True;
    match (
        is_true(&previous.conditions, disk::CONDITION),
        disk_pressure,
    ) {
        (false, true) => {
            publish(
                ctx,
                broker,
                EventType::Warning,
                disk::CONDITION,
                "DiskCheck",
                &disk_condition.message,
            )
            .await;
        }
        (true, false) if disk_condition.status == Status::False => {
            publish(
                ctx,
                broker,
                EventType::Normal,
                "DiskPressureRelieved",
                "DiskCheck",
                &disk_condition.message,
            )
            .await;
        }
        _ => {}
    }

    let draining = drain_status.is_some();
    let rolling = plan.partition > 0;
    let expanding = storage
        .as_ref()
        .is_some_and(|s| s.resized_claims < s.total_claims);
    let starting = ready < plan.replicas;
    let (progressing, progress_reason, progress_message) = if draining {
        (
            true,
            "Draining",
            "waiting for consumers to drain the leaving brokers".to_string(),
        )
    } else if rolling {
        (
            true,
            "RollingUpdate",
            format!("pods from ordinal {} run the new template", plan.partition),
        )
    } else if expanding {
        (
            true,
            "ExpandingVolumes",
            "volume claims are being resized".to_string(),
        )
    } else if starting {
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
    let ready_message = format!("{ready}/{wanted} brokers ready");
    let degraded = existing.is_some()
        && starting
        && !draining
        && !rolling
        && sts_status.updated_replicas.unwrap_or(0) >= plan.replicas;
    let conditions = conditions::merge(
        &previous.conditions,
        &[
            Desired::new(
                "Ready",
                ready >= wanted,
                if ready >= wanted {
                    "AllBrokersReady"
                } else {
                    "BrokersNotReady"
                },
                ready_message.clone(),
            ),
            Desired::new(
                "Progressing",
                progressing,
                progress_reason,
                progress_message,
            ),
            Desired::new(
                "Degraded",
                degraded,
                if degraded {
                    "BrokersUnavailable"
                } else {
                    "AsExpected"
                },
                ready_message,
            ),
            Desired::new("Paused", false, "NotPaused", "reconciling"),
            disk_condition,
        ],
        broker.metadata.generation,
        now,
    );
    let status = BrokerStatus {
        observed_generation: broker.metadata.generation,
        ready_replicas: ready,
        current_replicas: plan.replicas,
        brokers: (0..plan.replicas)
            .map(|ordinal| BrokerAddress {
                name: desired::pod_name(broker, ordinal),
                address: desired::broker_address(broker, ordinal),
            })
            .collect(),
        conditions,
        drain: drain_status,
        rollout: rolling.then(|| RolloutStatus {
            partition: plan.partition,
            updated_replicas: sts_status.updated_replicas.unwrap_or(0),
        }),
        storage,
    };
    patch_status(&brokers, &name, &status).await?;
    Ok(Action::requeue(if progressing {
        PROGRESS_REQUEUE
    } else if disk_pressure {
        DISK_PRESSURE_REQUEUE
    } else {
        IDLE_REQUEUE
    }))
}

/// Asks every broker for its disk state, all at once; never fails (a broker that does not
/// answer is reported as such, for the DiskPressure condition to say).
async fn probe_disks(broker: &Broker, replicas: i32, ctx: &Context) -> Vec<BrokerDisk> {
    let probes = (0..replicas).map(|ordinal| async move {
        let addr = BrokerAddr(desired::broker_address(broker, ordinal));
        let result = ctx.admin.runtime_info(&addr).await;
        if let Err(error) = &result {
            tracing::debug!(broker = %addr, %error, "no runtime info");
        }
        BrokerDisk {
            broker: desired::pod_name(broker, ordinal),
            probe: DiskProbe::from_result(result),
        }
    });
    futures::future::join_all(probes).await
}

/// The high water the brokers run with, for a broker that does not report its own.
fn default_high_water(broker: &Broker) -> f64 {
    let percent = broker
        .spec
        .retention
        .as_ref()
        .and_then(|retention| retention.disk_high_water_percent)
        .filter(|percent| (1..=100).contains(percent))
        .unwrap_or(BROKER_DISK_HIGH_WATER_PERCENT);
    f64::from(percent) / 100.0
}

/// Makes the leaving brokers read-only and measures what consumers still have to read there.
async fn drain(broker: &Broker, leaving: &[i32], ctx: &Context) -> Result<DrainProgress, Error> {
    let mut progress = DrainProgress::default();
    for ordinal in leaving {
        let addr = BrokerAddr(desired::broker_address(broker, *ordinal));
        ctx.admin
            .set_permission(&addr, BrokerPermission::ReadOnly)
            .await
            .map_err(Error::admin("making a leaving broker read-only"))?;
        let groups = ctx
            .admin
            .groups(&addr)
            .await
            .map_err(Error::admin("listing groups of a leaving broker"))?;
        for group in groups {
            let stats = ctx
                .admin
                .consume_stats(&addr, &group)
                .await
                .map_err(Error::admin("reading consume stats of a leaving broker"))?;
            progress.add_group(&group, &stats.queues);
        }
    }
    Ok(progress)
}

/// A scale-down reverted mid-drain: brokers that stay become writable again.
async fn restore_cancelled_drain(
    broker: &Broker,
    previous: &BrokerStatus,
    wanted: i32,
    ctx: &Context,
) -> Result<(), Error> {
    let Some(drain) = &previous.drain else {
        return Ok(());
    };
    let prefix = format!("{}-", broker.name_any());
    for name in &drain.brokers {
        let Some(ordinal) = name
            .strip_prefix(&prefix)
            .and_then(|ordinal| ordinal.parse::<i32>().ok())
        else {
            continue;
        };
        if ordinal < wanted {
            let addr = BrokerAddr(desired::broker_address(broker, ordinal));
            ctx.admin
                .set_permission(&addr, BrokerPermission::ReadWrite)
                .await
                .map_err(Error::admin("making a kept broker writable again"))?;
        }
    }
    Ok(())
}

/// Creates the spec's topics on every broker (idempotent on the broker side).
async fn ensure_topics(broker: &Broker, replicas: i32, ctx: &Context) -> Result<(), Error> {
    for ordinal in 0..replicas {
        let addr = BrokerAddr(desired::broker_address(broker, ordinal));
        for topic in &broker.spec.topics {
            // Creating persists the broker's topic table: skip topics already as specified.
            if let Ok(stats) = ctx.admin.topic_stats(&addr, &topic.name).await {
                if usize::try_from(topic.queues).is_ok_and(|queues| queues == stats.queues.len()) {
                    continue;
                }
            }
            let config = TopicConfig {
                name: topic.name.clone(),
                queues: topic.queues,
            };
            ctx.admin
                .create_topic(&addr, &config)
                .await
                .map_err(Error::admin("creating a spec topic"))?;
        }
    }
    Ok(())
}

/// Grows the volume claims of the current brokers to the spec size and reports progress;
/// `None` when the spec asks for no more than the claim template holds.
async fn expand_volumes(
    broker: &Broker,
    namespace: &str,
    plan: &RolloutPlan,
    ctx: &Context,
) -> Result<Option<StorageStatus>, Error> {
    let requested = &broker.spec.storage.size;
    let (Some(requested_bytes), Some(template_bytes)) =
        (quantity_bytes(requested), quantity_bytes(&plan.claim_size))
    else {
        return Ok(None);
    };
    if requested_bytes <= template_bytes {
        return Ok(None);
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
    let mut resized = 0;
    for ordinal in 0..plan.replicas {
        let claim_name = desired::claim_name(broker, ordinal);
        let Some(claim) = claims
            .get_opt(&claim_name)
            .await
            .map_err(Error::kube(format!("reading PVC {claim_name}")))?
        else {
            continue;
        };
        let storage_of = |quantities: Option<&std::collections::BTreeMap<String, Quantity>>| {
            quantities
                .and_then(|q| q.get("storage"))
                .and_then(|q| quantity_bytes(&q.0))
                .unwrap_or(0)
        };
        let current_request = storage_of(
            claim
                .spec
                .as_ref()
                .and_then(|spec| spec.resources.as_ref())
                .and_then(|r| r.requests.as_ref()),
        );
        if current_request < requested_bytes {
            let patch =
                serde_json::json!({"spec": {"resources": {"requests": {"storage": requested}}}});
            claims
                .patch(&claim_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(Error::kube(format!("expanding PVC {claim_name}")))?;
            tracing::info!(claim = %claim_name, size = %requested, "requested volume expansion");
        }
        let capacity = storage_of(
            claim
                .status
                .as_ref()
                .and_then(|status| status.capacity.as_ref()),
        );
        if capacity >= requested_bytes {
            resized += 1;
        }
    }
    Ok(Some(StorageStatus {
        requested: requested.clone(),
        resized_claims: resized,
        total_claims: plan.replicas,
    }))
}

async fn apply<K>(ctx: &Context, namespace: &str, object: &K) -> Result<(), Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + Serialize
        + Debug,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let name = object.name_any();
    api.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(object),
    )
    .await
    .map_err(Error::kube(format!("applying {} {name}", K::kind(&()))))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::BrokerFixture;
    use k8s_openapi::api::apps::v1::StatefulSetStatus;

    fn existing(broker: &Broker, plan: &RolloutPlan, status: StatefulSetStatus) -> StatefulSet {
        let mut sts = desired::stateful_set(broker, plan);
        sts.metadata.generation = Some(4);
        sts.status = Some(StatefulSetStatus {
            observed_generation: Some(4),
            ..status
        });
        sts
    }

    fn ready(replicas: i32, updated: i32) -> StatefulSetStatus {
        StatefulSetStatus {
            replicas,
            ready_replicas: Some(replicas),
            updated_replicas: Some(updated),
            ..StatefulSetStatus::default()
        }
    }

    #[test]
    fn no_statefulset_means_create_everything_at_once() {
        let broker = Broker::test().replicas(3);
        let (plan, phase) = plan_rollout(&broker, None, 3);
        assert_eq!((plan.partition, phase), (0, RolloutPhase::Creating));
    }

    #[test]
    fn template_change_starts_at_the_highest_ordinal() {
        let old = Broker::test().replicas(3);
        let sts = existing(&old, &RolloutPlan::initial(&old), ready(3, 3));
        let new = old.clone().image("quiver:2");
        let (plan, phase) = plan_rollout(&new, Some(&sts), 3);
        assert_eq!((plan.partition, phase), (2, RolloutPhase::Started));
    }

    #[test]
    fn partition_steps_down_only_when_the_updated_pods_are_ready() {
        let broker = Broker::test().replicas(3);
        let at = |partition| RolloutPlan {
            partition,
            ..RolloutPlan::initial(&broker)
        };
        let waiting = existing(&broker, &at(2), ready(3, 0));
        assert_eq!(
            plan_rollout(&broker, Some(&waiting), 3).1,
            RolloutPhase::Waiting
        );
        let mut not_ready = ready(3, 1);
        not_ready.ready_replicas = Some(2);
        let restarting = existing(&broker, &at(2), not_ready);
        assert_eq!(
            plan_rollout(&broker, Some(&restarting), 3).1,
            RolloutPhase::Waiting
        );
        let done_top = existing(&broker, &at(2), ready(3, 1));
        let (plan, phase) = plan_rollout(&broker, Some(&done_top), 3);
        assert_eq!((plan.partition, phase), (1, RolloutPhase::Stepped));
        let done = existing(&broker, &at(0), ready(3, 3));
        assert_eq!(
            plan_rollout(&broker, Some(&done), 3).1,
            RolloutPhase::Complete
        );
    }

    #[test]
    fn stale_statefulset_status_does_not_step() {
        let broker = Broker::test().replicas(3);
        let mut sts = existing(
            &broker,
            &RolloutPlan {
                partition: 2,
                ..RolloutPlan::initial(&broker)
            },
            ready(3, 1),
        );
        sts.metadata.generation = Some(5);
        assert_eq!(
            plan_rollout(&broker, Some(&sts), 3).1,
            RolloutPhase::Waiting
        );
    }

    #[test]
    fn claim_size_is_kept_from_the_existing_statefulset() {
        let broker = Broker::test().replicas(1);
        let sts = existing(&broker, &RolloutPlan::initial(&broker), ready(1, 1));
        let grown = broker.clone().storage_size("20Gi");
        let (plan, _) = plan_rollout(&grown, Some(&sts), 1);
        assert_eq!(plan.claim_size, "10Gi");
    }
}
