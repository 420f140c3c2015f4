"""Shared helpers for the chart tests: paths, rendering through the Helm v4 SDK, and the
generated files (chart CRD copies and the plain alert rules file)."""

from __future__ import annotations

import pathlib
import shutil
from typing import Any

import helm_python as helm
import yaml

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART_DIR = REPO_ROOT / "charts" / "quiver-operator"
TOP_CRDS_DIR = REPO_ROOT / "crds"
CHART_CRDS_DIR = CHART_DIR / "crds"
RULES_FILE = CHART_DIR / "alerts" / "quiver-alerts.rules.yaml"
DASHBOARD_FILE = CHART_DIR / "dashboards" / "quiver.json"
EXAMPLES_DIR = CHART_DIR / "examples"
METRICS_DOC = REPO_ROOT / "docs" / "METRICS.md"
HERE = pathlib.Path(__file__).resolve().parent
ALL_FEATURES_VALUES = HERE / "values-all-features.yaml"

RELEASE = "quiver"
NAMESPACE = "quiver-system"
# Oldest Kubernetes the chart declares (Chart.yaml kubeVersion) and the newest schemas known.
KUBE_VERSIONS = ("1.29.0", "1.37.0")


def load_values(path: pathlib.Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text()) or {}


def render(values: dict[str, Any] | None = None) -> dict[str, str]:
    """Template path -> rendered text, exactly as `helm template` would produce."""
    chart = helm.Chart.load(str(CHART_DIR))
    return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def manifests(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders (NOTES.txt excluded)."""
    objects = []
    for path, text in sorted(render(values).items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                objects.append(doc)
    return objects


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def crd_files(directory: pathlib.Path) -> dict[str, str]:
    """File name -> text of every CRD YAML file in a directory."""
    if not directory.is_dir():
        return {}
    return {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.suffix in (".yaml", ".yml")}


def rendered_alert_groups(values: dict[str, Any] | None = None) -> dict[str, Any]:
    """The `spec` (a rule-file `groups:` document) of the PrometheusRule the chart renders."""
    merged = {"prometheusRule": {"enabled": True}}
    if values:
        merged = _deep_merge(merged, values)
    rules = by_kind(manifests(merged), "PrometheusRule")
    assert len(rules) == 1, rules
    return rules[0]["spec"]


def sync_crds() -> list[str]:
    """Copy the generated top-level crds/ into the chart's crds/; returns the copied names."""
    CHART_CRDS_DIR.mkdir(parents=True, exist_ok=True)
    top = crd_files(TOP_CRDS_DIR)
    for stale in set(crd_files(CHART_CRDS_DIR)) - set(top):
        (CHART_CRDS_DIR / stale).unlink()
    for name in top:
        shutil.copyfile(TOP_CRDS_DIR / name, CHART_CRDS_DIR / name)
    return sorted(top)


def write_rules_file() -> None:
    header = (
        "# Quiver alert rules as a plain Prometheus rule file (the chart's PrometheusRule with\n"
        "# default values). Generated: python e2e/chart/sync_generated.py; do not edit by hand.\n"
    )
    body = yaml.dump(rendered_alert_groups(), Dumper=_BlockDumper, sort_keys=False, width=1000)
    RULES_FILE.parent.mkdir(parents=True, exist_ok=True)
    RULES_FILE.write_text(header + body)


class _BlockDumper(yaml.SafeDumper):
    """Writes multi-line strings (PromQL) as literal blocks so the file reads like the template."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_BlockDumper.add_representer(str, _represent_str)


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def strict_monitoring_schema(kind: str) -> dict[str, Any]:
    """JSON schema of a prometheus-operator kind (ServiceMonitor, PodMonitor, PrometheusRule),
    taken from models generated from its CRDs, made strict: unknown fields are rejected."""
    from cloudcoil.models.prometheus_operator import v1

    schema = getattr(v1, kind).model_json_schema(by_alias=True, mode="validation")
    _forbid_unknown_fields(schema)
    return schema


def _forbid_unknown_fields(node: Any) -> None:
    if isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        # Go accepts inline flags anywhere (`^(?i)...`); Python only at the start.
        if isinstance(node.get("pattern"), str) and "(?i)" in node["pattern"]:
            node["pattern"] = "(?i)" + node["pattern"].replace("(?i)", "")
        for child in node.values():
            _forbid_unknown_fields(child)
    elif isinstance(node, list):
        for child in node:
            _forbid_unknown_fields(child)
