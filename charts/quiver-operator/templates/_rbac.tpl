{{/*
RBAC rules: exactly the requests the operator makes, no more. operator/src/scenarios/broker_rbac.rs
records every request of the reconcilers, the controllers' watches and the leader election against
the operator's test API server and fails when these rules differ from them.
*/}}

{{/* Namespaced resources, granted cluster-wide or in the watched namespace only. */}}
{{- define "quiver-operator.managedRules" -}}
# The controllers list and watch Brokers; a ConsumerGroup reads its Broker.
- apiGroups: ["quiver.io"]
  resources: ["brokers"]
  verbs: ["get", "list", "watch"]
# The ConsumerGroup finalizer (offsets deleted with the resource) is added and removed by patch;
# a status write (and an offset reset's record) starts from a fresh read.
- apiGroups: ["quiver.io"]
  resources: ["consumergroups"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["quiver.io"]
  resources: ["brokers/status", "consumergroups/status"]
  verbs: ["patch"]
# Server-side apply (patch, and create for a new object); the controller watches them through
# metadata watches, and reads the StatefulSet's status. A StatefulSet an older operator made with
# OrderedReady pod management (immutable) is deleted with its pods orphaned and created again.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["list", "watch", "create", "patch"]
# A replicated Broker has a budget per broker group; a group scaled away loses its budget.
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["list", "watch", "create", "patch", "delete"]
# A Broker's NetworkPolicy (spec.networkPolicy), deleted when the spec drops it.
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# spec.security: the referenced Secrets are read (their data hashed into the pod template, the
# admin account taken for the operator's own calls); their metadata is watched so a change rolls
# the pods. The operator never writes Secrets.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "list", "watch"]
# Volume expansion reads and patches the claims.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "patch"]
# A pod stuck not Ready at an outdated revision is deleted so the StatefulSet rollout moves on;
# a replicated Broker's pods are deleted one by one in its rollout order (OnDelete).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "delete"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}

{{/* Cluster-scoped resources: always a ClusterRole, also when one namespace is watched. */}}
{{- define "quiver-operator.clusterRules" -}}
# Before a volume expansion: whether the claims' (or the default) StorageClass allows it.
- apiGroups: ["storage.k8s.io"]
  resources: ["storageclasses"]
  verbs: ["list"]
{{- end -}}

{{/* The leader election Lease. */}}
{{- define "quiver-operator.leaderElectionRules" -}}
- apiGroups: ["coordination.k8s.io"]
  resources: ["leases"]
  verbs: ["get", "create", "patch"]
{{- end -}}
