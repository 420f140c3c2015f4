"""The chart README documents every value in values.yaml with its default."""

import json
import re

import yaml
from chartlib import CHART_DIR


def leaf_values(node, prefix=""):
    """Dotted path -> default, stopping at empty maps/lists and at maps documented as a whole."""
    if isinstance(node, dict) and node and prefix not in WHOLE_VALUES:
        for key, child in node.items():
            yield from leaf_values(child, f"{prefix}.{key}" if prefix else key)
    else:
        yield prefix, node


# Maps passed to Kubernetes as they are: documented as one value.
WHOLE_VALUES = {
    "podSecurityContext",
    "securityContext",
    "resources",
    "metrics.brokerPodMonitor.podSelector",
    "grafanaDashboard.labels",
    "networkPolicy.metricsNamespaceSelector",
}


def documented_rows():
    readme = (CHART_DIR / "README.md").read_text()
    section = readme.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `([A-Za-z0-9_.]+)` \| (.*?) \|", section, re.MULTILINE))


def test_every_value_is_documented_with_its_default():
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    rows = documented_rows()
    missing = []
    for path, default in leaf_values(values):
        if path not in rows:
            missing.append(path)
            continue
        if not isinstance(default, dict) or not default:
            assert json.dumps(default) in rows[path] or f"`{default}`" in rows[path], (path, rows[path])
    assert missing == []


def test_readme_documents_no_value_that_does_not_exist():
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    known = {path for path, _ in leaf_values(values)}
    assert set(documented_rows()) - known == set()
