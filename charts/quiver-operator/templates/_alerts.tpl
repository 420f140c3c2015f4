{{/*
The Quiver alert rules as a Prometheus rule-file `groups:` list. The PrometheusRule embeds it;
alerts/quiver-alerts.rules.yaml is this template rendered with the default values (a test keeps
the two identical). Rule annotations keep Prometheus' own {{ }} templating inside raw strings.
*/}}
{{- define "quiver-operator.alertGroups" -}}
{{- $r := .Values.prometheusRule -}}
{{- $runbook := "https://github.com/quiver-mq/quiver/blob/main/charts/quiver-operator/README.md" -}}
groups:
  - name: quiver-consumer
    rules:
      - alert: QuiverConsumerLagHigh
        # Broker and operator both export the lag series; max() collapses the duplicates. The
        # namespace keeps same-named groups of two namespaces apart.
        expr: max by (namespace, cluster, consumer_group, topic) (rocketmq_consumer_lag_messages) > {{ $r.consumerLag.thresholdMessages }}
        for: {{ $r.consumerLag.for }}
        labels:
          severity: {{ $r.consumerLag.severity }}
        annotations:
          summary: {{`Consumer group {{ $labels.consumer_group }} is {{ $value }} messages behind on topic {{ $labels.topic }}`}}
          description: {{ printf "%s%v%s%s%s" `Consumer group {{ $labels.consumer_group }} in cluster {{ $labels.cluster }} (namespace {{ $labels.namespace }}) has had more than ` $r.consumerLag.thresholdMessages ` unconsumed messages on topic {{ $labels.topic }} for ` $r.consumerLag.for `. Consumers are too slow, too few, or not running.` | quote }}
          runbook_url: {{ printf "%s#quiverconsumerlaghigh" $runbook }}
      - alert: QuiverConsumerTimeLagHigh
        expr: max by (namespace, cluster, consumer_group, topic) (rocketmq_consumer_lag_latency) / 1000 > {{ $r.consumerTimeLag.thresholdSeconds }}
        for: {{ $r.consumerTimeLag.for }}
        labels:
          severity: {{ $r.consumerTimeLag.severity }}
        annotations:
          summary: {{`Consumer group {{ $labels.consumer_group }} is {{ $value | humanizeDuration }} behind on topic {{ $labels.topic }}`}}
          description: {{ printf "%s%v%s%s%s" `The oldest message on topic {{ $labels.topic }} not yet consumed by group {{ $labels.consumer_group }} (cluster {{ $labels.cluster }}, namespace {{ $labels.namespace }}) has waited more than ` $r.consumerTimeLag.thresholdSeconds ` seconds, for ` $r.consumerTimeLag.for `.` | quote }}
          runbook_url: {{ printf "%s#quiverconsumertimelaghigh" $runbook }}
      - alert: QuiverConsumerGroupStalled
        # Lag is positive yet no committed offset moved in the whole window.
        expr: |-
          (max by (namespace, cluster, consumer_group, topic) (rocketmq_consumer_lag_messages) > 0)
          and on (namespace, cluster, consumer_group, topic)
          (max by (namespace, cluster, consumer_group, topic) (changes(quiver_consumer_committed_offset[{{ $r.consumerStalled.window }}])) == 0)
        for: {{ $r.consumerStalled.for }}
        labels:
          severity: {{ $r.consumerStalled.severity }}
        annotations:
          summary: {{`Consumer group {{ $labels.consumer_group }} stopped committing on topic {{ $labels.topic }} while {{ $value }} messages wait`}}
          description: {{ printf "%s%s%s" `Consumer group {{ $labels.consumer_group }} in cluster {{ $labels.cluster }} (namespace {{ $labels.namespace }}) has unconsumed messages on topic {{ $labels.topic }} and has not committed any offset for ` $r.consumerStalled.window `. Its consumers are down, stuck, or failing every message.` | quote }}
          runbook_url: {{ printf "%s#quiverconsumergroupstalled" $runbook }}
      - alert: QuiverConsumerQueueStalled
        # The operator's per-queue judgement: one stuck queue shows even while the group's sums
        # move, which QuiverConsumerGroupStalled cannot see. A group stalled as a whole counts
        # its queues too (the QueuesStalled condition's reason says which case it is).
        expr: max by (namespace, cluster, consumer_group) (quiver_consumer_group_stalled_queues) > 0
        for: {{ $r.consumerQueueStalled.for }}
        labels:
          severity: {{ $r.consumerQueueStalled.severity }}
        annotations:
          summary: {{`Consumer group {{ $labels.consumer_group }} in namespace {{ $labels.namespace }} has {{ $value }} queues with lag and no commit`}}
          description: {{ printf "%s%s%s" `Consumer group {{ $labels.consumer_group }} in cluster {{ $labels.cluster }} (namespace {{ $labels.namespace }}) has {{ $value }} queues that have had unconsumed messages and no committed offset for the group's whole judgement window (spec.lagThresholds.windowSeconds, 10m by default), and has had such queues for ` $r.consumerQueueStalled.for `, whether or not its other queues progress. The ConsumerGroup's status.stalledQueues and its QueuesStalled condition name them: a consumer is stuck on a message of those queues, or no consumer is assigned them.` | quote }}
          runbook_url: {{ printf "%s#quiverconsumerqueuestalled" $runbook }}
      - alert: QuiverConsumerGroupLagUnknown
        # The operator drops a group's lag series when a poll fails, so the lag alerts go
        # silent: this one says the lag is unknown instead.
        expr: max by (namespace, cluster, consumer_group) (quiver_lag_poll_success) == 0
        for: {{ dig "consumerLagUnknown" "for" "10m" $r }}
        labels:
          severity: {{ dig "consumerLagUnknown" "severity" "warning" $r }}
        annotations:
          summary: {{`Lag of consumer group {{ $labels.consumer_group }} in namespace {{ $labels.namespace }} is unknown`}}
          description: {{ printf "%s%s%s" `The operator has failed to poll the lag of consumer group {{ $labels.consumer_group }} (Broker {{ $labels.cluster }}, namespace {{ $labels.namespace }}) for ` (dig "consumerLagUnknown" "for" "10m" $r) `: no broker answered, a broker refused, or the Broker does not exist. The lag alerts cannot fire for it meanwhile. The ConsumerGroup's Ready condition and its Warning events give the cause.` | quote }}
          runbook_url: {{ printf "%s#quiverconsumergrouplagunknown" $runbook }}
  - name: quiver-broker
    rules:
      - alert: QuiverBrokerDown
        expr: up{job={{ $r.brokerJob | quote }}} == 0
        for: {{ $r.brokerDown.for }}
        labels:
          severity: {{ $r.brokerDown.severity }}
        annotations:
          summary: {{`Broker {{ $labels.instance }} is down`}}
          description: {{ printf "%s%s%s" `Prometheus has not been able to scrape broker {{ $labels.instance }} for ` $r.brokerDown.for `. Its queues cannot be produced to or consumed from.` | quote }}
          runbook_url: {{ printf "%s#quiverbrokerdown" $runbook }}
      - alert: QuiverBrokerNotReady
        expr: quiver_broker_ready == 0
        for: {{ $r.brokerNotReady.for }}
        labels:
          severity: {{ $r.brokerNotReady.severity }}
        annotations:
          summary: {{`Broker {{ $labels.instance }} of cluster {{ $labels.cluster }} is not ready`}}
          description: {{ printf "%s%s%s" `Broker {{ $labels.instance }} of cluster {{ $labels.cluster }} has reported not ready for ` $r.brokerNotReady.for `: store recovery has not finished or the broker does not serve.` | quote }}
          runbook_url: {{ printf "%s#quiverbrokernotready" $runbook }}
      # The three disk alerts follow the broker's thresholds: retention deletes consumed
      # segments early from disk-clean-ratio (75%) and unconsumed ones from
      # disk-force-clean-ratio (85%); from disk-high-water-ratio (90%) sends are refused.
      - alert: QuiverStoreDiskNearlyFull
        # The early warning; silent once QuiverBrokerDiskAboveHighWater takes over.
        expr: |-
          quiver_store_disk_used_ratio > {{ $r.storeDiskFull.thresholdRatio }}
          unless
          quiver_store_disk_used_ratio > quiver_store_disk_high_water_ratio
        for: {{ $r.storeDiskFull.for }}
        labels:
          severity: {{ $r.storeDiskFull.severity }}
        annotations:
          summary: {{`Store of broker {{ $labels.instance }} is {{ $value | humanizePercentage }} full`}}
          description: {{ printf "%s%v%s%s%s" `The file system holding the store of broker {{ $labels.instance }} (cluster {{ $labels.cluster }}) has been more than ` $r.storeDiskFull.thresholdRatio ` full for ` $r.storeDiskFull.for `, so retention cannot free enough space: consumer groups still need the old segments, or the volume is too small for the retention. Above disk-force-clean-ratio retention deletes unconsumed messages; at disk-high-water-ratio the broker refuses sends.` | quote }}
          runbook_url: {{ printf "%s#quiverstoredisknearlyfull" $runbook }}
      - alert: QuiverBrokerDiskAboveHighWater
        expr: quiver_store_disk_used_ratio > quiver_store_disk_high_water_ratio
        for: {{ $r.brokerDiskAboveHighWater.for }}
        labels:
          severity: {{ $r.brokerDiskAboveHighWater.severity }}
        annotations:
          summary: {{`Broker {{ $labels.instance }} refuses sends, its store is {{ $value | humanizePercentage }} full (above its high water)`}}
          description: {{ printf "%s%s%s" `The store of broker {{ $labels.instance }} (cluster {{ $labels.cluster }}) has been above its disk-high-water-ratio for ` $r.brokerDiskAboveHighWater.for `. The broker refuses sends (SERVICE_NOT_AVAILABLE) and still serves reads; producers fail over to other brokers if they have any. Expand the volume (spec.storage.size).` | quote }}
          runbook_url: {{ printf "%s#quiverbrokerdiskabovehighwater" $runbook }}
      - alert: QuiverBrokerWritesRefused
        # The reason label comes from quiver_store_write_refusal; without that series the
        # alert still fires, without a reason.
        expr: |-
          (quiver_store_writable == 0) * ignoring (reason) group_left (reason) (quiver_store_write_refusal == 1)
          or ignoring (reason)
          quiver_store_writable == 0
        for: {{ $r.brokerWritesRefused.for }}
        labels:
          severity: {{ $r.brokerWritesRefused.severity }}
        annotations:
          summary: {{`Broker {{ $labels.instance }} refuses sends ({{ or $labels.reason "no reason given" }})`}}
          description: {{ printf "%s%s%s" `The store of broker {{ $labels.instance }} (cluster {{ $labels.cluster }}) has refused writes for ` $r.brokerWritesRefused.for ` (reason: {{ or $labels.reason "not reported" }}). Sends to it fail with SERVICE_NOT_AVAILABLE; reads are still served. The Broker's DiskPressure condition names the cause.` | quote }}
          runbook_url: {{ printf "%s#quiverbrokerwritesrefused" $runbook }}
  - name: quiver-replication
    rules:
      - alert: QuiverReplicationLagHigh
        # The master of a replicated broker group exports one series per replica.
        expr: quiver_replication_lag_seconds > {{ $r.replicationLag.thresholdSeconds }}
        for: {{ $r.replicationLag.for }}
        labels:
          severity: {{ $r.replicationLag.severity }}
        annotations:
          summary: {{`Replica {{ $labels.replica_id }} of the group of master {{ $labels.instance }} is {{ $value | humanizeDuration }} behind`}}
          description: {{ printf "%s%v%s%s%s" `Replica {{ $labels.replica_id }} of the broker group whose master is {{ $labels.instance }} (cluster {{ $labels.cluster }}) has been more than ` $r.replicationLag.thresholdSeconds ` seconds behind the master's CommitLog for ` $r.replicationLag.for `. A failover now would pick among fewer up-to-date members; in sync mode the replica may drop out of the in-sync set. Its disk, network or the master's send rate is the cause.` | quote }}
          runbook_url: {{ printf "%s#quiverreplicationlaghigh" $runbook }}
      - alert: QuiverReplicationBelowMinInSync
        expr: quiver_replication_in_sync_replicas < quiver_replication_min_in_sync_replicas
        for: {{ $r.replicationBelowMinInSync.for }}
        labels:
          severity: {{ $r.replicationBelowMinInSync.severity }}
        annotations:
          summary: {{`The broker group of {{ $labels.instance }} has {{ $value }} members in sync, below its minimum`}}
          description: {{ printf "%s%s%s" `The broker group of {{ $labels.instance }} (cluster {{ $labels.cluster }}) has had fewer members in sync than its min-in-sync-replicas for ` $r.replicationBelowMinInSync.for `: its master refuses sends until enough replicas catch up. The Broker's ReplicationDegraded condition names the group and its members.` | quote }}
          runbook_url: {{ printf "%s#quiverreplicationbelowmininsync" $runbook }}
  - name: quiver-operator
    rules:
      - alert: QuiverOperatorReconcileErrors
        expr: sum by (controller) (rate(quiver_reconcile_errors_total[5m])) > 0
        for: {{ $r.reconcileErrors.for }}
        labels:
          severity: {{ $r.reconcileErrors.severity }}
        annotations:
          summary: {{`The {{ $labels.controller }} controller keeps failing to reconcile`}}
          description: {{ printf "%s%s%s" `The quiver-operator {{ $labels.controller }} controller has failed reconciliations continuously for ` $r.reconcileErrors.for ` (by kind: quiver_reconcile_errors_total{error=...}). Resources it manages are not converging to their spec.` | quote }}
          runbook_url: {{ printf "%s#quiveroperatorreconcileerrors" $runbook }}
      - alert: QuiverOperatorDown
        expr: up{job={{ $r.operatorJob | quote }}} == 0
        for: {{ $r.operatorDown.for }}
        labels:
          severity: {{ $r.operatorDown.severity }}
        annotations:
          summary: {{`The Quiver operator {{ $labels.instance }} is down`}}
          description: {{ printf "%s%s%s" `Prometheus has not been able to scrape the Quiver operator {{ $labels.instance }} for ` $r.operatorDown.for `. Brokers keep running, but spec changes, scaling and lag reporting stop.` | quote }}
          runbook_url: {{ printf "%s#quiveroperatordown" $runbook }}
{{- end -}}
