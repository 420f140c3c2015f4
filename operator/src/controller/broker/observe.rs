//! The first step of a pass: read everything the plan decides from, and nothing else. Reads
//! that the plan's own rules make unnecessary (pods while no pod can be stuck, claims while no
//! volume grows) are skipped, by asking the plan's pure helpers.

use super::{drift, plan, Problem};
use crate::admin::BrokerAddr;
use crate::controller::drain::{self, LeavingBroker};
use crate::controller::replication::{self, GroupObservation};
use crate::controller::rollout::{self, plan_rollout};
use crate::controller::{error_chain, expansion, read_own_write, security, Context, Error};
use crate::crd::Broker;
use crate::desired::{self, RolloutPlan};
use crate::disk::{BrokerDisk, DiskProbe};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;

/// What one pass knows about a Broker and everything it owns.
#[derive(Clone, Debug)]
pub struct World {
    /// The Broker: the watch's copy, or the stored one when the watch has not delivered this
    /// operator's last status write yet.
    pub broker: Broker,
    pub namespace: String,
    /// The operator's clock, in Unix milliseconds.
    pub now_ms: i64,
    /// The operator's own pods, which the Broker's NetworkPolicy admits.
    pub operator: desired::OperatorPods,
    pub state: State,
}

/// How far a pass gets: a paused Broker and one whose Secrets are missing read no further.
#[derive(Clone, Debug)]
pub enum State {
    /// The `quiver.io/paused` annotation is set.
    Paused,
    /// A Secret of spec.security is missing or lacks a key.
    SecretsMissing(Problem),
    /// Everything the plan needs.
    Running(Box<Cluster>),
}

/// The Broker's objects and its brokers' answers.
#[derive(Clone, Debug, Default)]
pub struct Cluster {
    /// Hash of the data of the Secrets spec.security names (None when it names none).
    pub security_hash: Option<String>,
    pub statefulset: Option<StatefulSet>,
    /// The brokers a scale-down removes, made read-only and measured (what is left to read).
    pub leaving: Vec<LeavingBroker>,
    /// The Broker's pods, listed only while one may be stuck or a replicated group may roll.
    pub pods: Option<Result<Vec<Pod>, String>>,
    /// Each broker group's replication, with spec.replication and a StatefulSet only.
    pub groups: Option<Vec<GroupObservation>>,
    /// The per-group PodDisruptionBudgets that exist (replicated Brokers only).
    pub group_budgets: Vec<PodDisruptionBudget>,
    /// The NetworkPolicy of the Broker's name, read only when the spec wants none.
    pub network_policy: Option<NetworkPolicy>,
    /// The volume claims, read only while the spec asks for more storage than the template.
    pub claims: Vec<PersistentVolumeClaim>,
    /// The StorageClasses, read only when a claim is to grow.
    pub storage_classes: Option<Result<Vec<StorageClass>, String>>,
    /// Queues of each spec topic on each broker it is created on, as they answered.
    pub topic_queues: BTreeMap<(BrokerAddr, String), usize>,
    /// Each broker's disk, as it answered.
    pub disks: Vec<BrokerDisk>,
}

/// Reads the world of `cached` in `namespace`. A failed API read fails the pass; a broker that
/// does not answer is part of the world.
pub async fn observe(cached: &Broker, namespace: String, ctx: &Context) -> Result<World, Error> {
    let brokers: Api<Broker> = Api::namespaced(ctx.client.clone(), &namespace);
    let stored = read_own_write(&brokers, cached, ctx).await?;
    let broker = stored.unwrap_or_else(|| cached.clone());
    let mut world = World {
        now_ms: (ctx.clock)(),
        operator: desired::OperatorPods {
            namespace: ctx.client.default_namespace().to_string(),
            labels: ctx.operator_pod_labels.clone(),
        },
        state: State::Paused,
        namespace,
        broker,
    };
    if world.broker.is_paused() {
        return Ok(world);
    }
    world.state = match security::resolve(&world.broker, &world.namespace, ctx).await? {
        Err(problem) => State::SecretsMissing(problem),
        Ok(secrets) => {
            let scope = desired::broker_scope(&world.broker);
            ctx.admin.use_access(&scope, secrets.access);
            State::Running(Box::new(observe_cluster(&world, secrets.hash, ctx).await?))
        }
    };
    Ok(world)
}

async fn observe_cluster(
    world: &World,
    security_hash: Option<String>,
    ctx: &Context,
) -> Result<Cluster, Error> {
    let broker = &world.broker;
    let name = broker.name_any();
    let statefulsets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &world.namespace);
    let statefulset = statefulsets
        .get_opt(&name)
        .await
        .map_err(Error::kube(format!("reading StatefulSet {name}")))?;
    let mut cluster = Cluster {
        security_hash,
        statefulset,
        ..Cluster::default()
    };
    if let Some(leaving) = plan::leaving_ordinals(broker, cluster.statefulset.as_ref()) {
        // Measuring a broker that still takes writes tells nothing: each is fenced first.
        cluster.leaving = drain::inspect_leaving(broker, leaving, ctx, world.now_ms).await;
    }
    let replicas = plan::pods_to_run(broker, cluster.statefulset.as_ref(), &cluster.leaving);
    let (rollout, _) = plan_rollout(
        broker,
        cluster.statefulset.as_ref(),
        replicas,
        cluster.security_hash.clone(),
    );
    observe_objects(world, &mut cluster, ctx).await?;
    observe_claims(world, &rollout, &mut cluster, ctx).await?;
    if cluster.statefulset.is_some() {
        observe_brokers(broker, replicas, &mut cluster, ctx).await;
    }
    Ok(cluster)
}

/// The pods, the group budgets and the NetworkPolicy, each when the plan needs it.
async fn observe_objects(world: &World, cluster: &mut Cluster, ctx: &Context) -> Result<(), Error> {
    let broker = &world.broker;
    let namespace = world.namespace.as_str();
    let lists_pods = cluster.statefulset.as_ref().is_some_and(|sts| {
        rollout::may_have_stuck_pod(sts)
            || plan::steps_groups(broker, sts)
            || !drift::template_drift(sts).is_empty()
    });
    if lists_pods {
        let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), namespace);
        let listed = pods
            .list(&ListParams::default().labels(&desired::pod_selector(broker)))
            .await;
        cluster.pods = Some(listed.map(|list| list.items).map_err(|e| error_chain(&e)));
    }
    if broker.is_replicated() {
        let api: Api<PodDisruptionBudget> = Api::namespaced(ctx.client.clone(), namespace);
        let selector = format!("{},{}", desired::pod_selector(broker), desired::GROUP_LABEL);
        let listed = api
            .list(&ListParams::default().labels(&selector))
            .await
            .map_err(Error::kube("listing PodDisruptionBudgets".to_string()))?;
        cluster.group_budgets = listed.items;
    }
    if desired::network_policy(broker, &world.operator).is_none() {
        let policies: Api<NetworkPolicy> = Api::namespaced(ctx.client.clone(), namespace);
        let name = broker.name_any();
        cluster.network_policy = policies
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("reading NetworkPolicy {name}")))?;
    }
    Ok(())
}

/// The claims of the running brokers while the spec asks for more storage than the claim
/// template has, and the StorageClasses when one of them is to grow.
async fn observe_claims(
    world: &World,
    rollout: &RolloutPlan,
    cluster: &mut Cluster,
    ctx: &Context,
) -> Result<(), Error> {
    let broker = &world.broker;
    let Some(wanted) = cluster
        .statefulset
        .as_ref()
        .and_then(|_| expansion::growth(&broker.spec.storage.size, &rollout.claim_size))
    else {
        return Ok(());
    };
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &world.namespace);
    for ordinal in 0..rollout.replicas {
        let name = desired::claim_name(broker, ordinal);
        let claim = claims
            .get_opt(&name)
            .await
            .map_err(Error::kube(format!("reading PVC {name}")))?;
        cluster.claims.extend(claim);
    }
    if expansion::to_grow(&cluster.claims, wanted).next().is_some() {
        let classes: Api<StorageClass> = Api::all(ctx.client.clone());
        let listed = classes.list(&ListParams::default()).await;
        cluster.storage_classes = Some(listed.map(|list| list.items).map_err(|e| error_chain(&e)));
    }
    Ok(())
}

/// What the brokers answer: each group's replication, the spec topics' queues, the disks. A
/// broker that does not answer is left out (or reported as such, for the disks).
async fn observe_brokers(broker: &Broker, replicas: i32, cluster: &mut Cluster, ctx: &Context) {
    if broker.is_replicated() {
        // Pods a replicas decrease still keeps (members not yet removed) are asked too.
        let existing = cluster
            .statefulset
            .as_ref()
            .and_then(|sts| sts.spec.replicas)
            .unwrap_or(0);
        let groups = desired::groups_of_pods(broker, replicas);
        let asked = replicas.max(existing);
        cluster.groups = Some(replication::observe(broker, groups, asked, ctx).await);
    }
    if plan::creates_topics(broker, cluster.statefulset.as_ref(), replicas) {
        for addr in plan::topic_targets(broker, replicas, cluster.groups.as_deref()) {
            for topic in &broker.spec.topics {
                if let Ok(stats) = ctx.admin.topic_stats(&addr, &topic.name).await {
                    let key = (addr.clone(), topic.name.clone());
                    cluster.topic_queues.insert(key, stats.queues.len());
                }
            }
        }
    }
    cluster.disks = probe_disks(broker, replicas, ctx).await;
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
