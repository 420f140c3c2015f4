"""values.schema.json: the defaults pass, and every kind of bad value fails at install time with a
message naming the offending key."""

import helm_python as helm
import pytest
from chartlib import CHART_DIR, HERE, load_values, render


def chart():
    return helm.Chart.load(str(CHART_DIR))


def test_default_values_satisfy_the_schema():
    chart().validate_schema(None)


@pytest.mark.parametrize(
    "values,message",
    [
        ({"replicaCount": "three"}, "at '/replicaCount': got string, want integer"),
        ({"replicaCount": 0}, "at '/replicaCount': minimum: got 0, want 1"),
        ({"image": {"pullPolicy": "Sometimes"}}, "at '/image/pullPolicy': value must be one of"),
        ({"image": {"digest": "latest"}}, "at '/image/digest'"),
        ({"replicas": 2}, "additional properties 'replicas' not allowed"),
        ({"prometheusRule": {"consumerLag": {"for": "ten minutes"}}}, "at '/prometheusRule/consumerLag/for'"),
        (
            {"prometheusRule": {"storeDiskFull": {"thresholdRatio": 1.5}}},
            "at '/prometheusRule/storeDiskFull/thresholdRatio'",
        ),
        ({"prometheusRule": {"consumerLag": {"severity": "page"}}}, "at '/prometheusRule/consumerLag/severity'"),
        (
            {"prometheusRule": {"brokerDiskAboveHighWater": {"for": "five minutes"}}},
            "at '/prometheusRule/brokerDiskAboveHighWater/for'",
        ),
        (
            {"prometheusRule": {"brokerWritesRefused": {"severity": "page"}}},
            "at '/prometheusRule/brokerWritesRefused/severity'",
        ),
        (
            {"prometheusRule": {"consumerQueueStalled": {"for": "five minutes"}}},
            "at '/prometheusRule/consumerQueueStalled/for'",
        ),
        (
            {"prometheusRule": {"consumerQueueStalled": {"severity": "page"}}},
            "at '/prometheusRule/consumerQueueStalled/severity'",
        ),
        ({"watchNamespace": "Bad_NS"}, "at '/watchNamespace'"),
        ({"metrics": {"service": {"port": 70000}}}, "at '/metrics/service/port'"),
        (
            {"metrics": {"brokerPodMonitor": {"podSelector": {"app": 5}}}},
            "at '/metrics/brokerPodMonitor/podSelector/app'",
        ),
        ({"grafanaDashboard": {"labels": {"grafana_dashboard": 1}}}, "at '/grafanaDashboard/labels/grafana_dashboard'"),
        ({"lagIntervalSeconds": 0}, "at '/lagIntervalSeconds'"),
        ({"logFormat": "xml"}, "at '/logFormat'"),
    ],
)
def test_bad_values_are_rejected_with_the_key_named(values, message):
    with pytest.raises(helm.HelmValuesError) as failure:
        render(values)
    assert message in str(failure.value)


def test_bad_values_file_is_rejected():
    with pytest.raises(helm.HelmValuesError) as failure:
        render(load_values(HERE / "values-bad.yaml"))
    assert "values don't meet the specifications of the schema" in str(failure.value)


def test_several_replicas_without_leader_election_fail_with_an_explanation():
    with pytest.raises(helm.HelmRenderError) as failure:
        render({"replicaCount": 2, "leaderElection": {"enabled": False}})
    assert "replicaCount > 1 needs leaderElection.enabled=true" in str(failure.value)
