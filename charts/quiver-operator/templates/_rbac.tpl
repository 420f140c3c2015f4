{{/* Everything the reconcilers touch, granted cluster-wide or in the watched namespace only. */}}
{{- define "quiver-operator.managedRules" -}}
- apiGroups: ["quiver.io"]
  resources: ["brokers"]
  verbs: ["get", "list", "watch"]
# The ConsumerGroup finalizer (offsets deleted with the resource) is added and removed by patch.
- apiGroups: ["quiver.io"]
  resources: ["consumergroups"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["quiver.io"]
  resources: ["brokers/status", "consumergroups/status"]
  verbs: ["get", "patch"]
# Owner references with blockOwnerDeletion need update on the owner's finalizers.
- apiGroups: ["quiver.io"]
  resources: ["brokers/finalizers"]
  verbs: ["update"]
# Applied with server-side apply (patch); owner references let the garbage collector delete them.
- apiGroups: ["apps"]
  resources: ["statefulsets"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch"]
# Expansion reads and patches the claims; the StatefulSet controller applies the retention policy.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "patch"]
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["events.k8s.io"]
  resources: ["events"]
  verbs: ["create", "patch"]
{{- end -}}
