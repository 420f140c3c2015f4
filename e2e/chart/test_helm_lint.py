"""`helm lint --strict` through the Helm v4 SDK: default values, every feature on, namespaced."""

import helm_python as helm
import pytest
from chartlib import ALL_FEATURES_VALUES, CHART_DIR, KUBE_VERSIONS, load_values

WARNING = 2


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
@pytest.mark.parametrize(
    "values_name,values",
    [
        ("defaults", None),
        ("all-features", load_values(ALL_FEATURES_VALUES)),
        ("namespaced", {"watchNamespace": "messaging"}),
        ("single-replica-no-leader-election", {"leaderElection": {"enabled": False}}),
    ],
)
def test_lint_strict_passes(values_name, values, kube_version):
    report = helm.lint(str(CHART_DIR), values, strict=True, namespace="quiver-system", kube_version=f"v{kube_version}")
    assert report["total_charts_linted"] == 1
    assert report["errors"] == [], report
    serious = [m for m in report["messages"] if m["severity"] >= WARNING]
    assert serious == [], serious


def test_lint_strict_reports_schema_errors_of_a_bad_values_file():
    from chartlib import HERE

    report = helm.lint(str(CHART_DIR), load_values(HERE / "values-bad.yaml"), strict=True)
    text = "\n".join(report["errors"])
    for fragment in (
        "/replicaCount",
        "/image/pullPolicy",
        "/prometheusRule/consumerLag/for",
        "/prometheusRule/storeDiskFull/thresholdRatio",
        "/metrics/service/port",
        "/watchNamespace",
        "'servicemonitor' not allowed",
    ):
        assert fragment in text, f"{fragment!r} missing from lint errors:\n{text}"
