"""The example Broker and ConsumerGroup manifests are valid against our CRD schemas (strict:
unknown fields are errors, as with kubectl's default server-side field validation)."""

import copy

import jsonschema
import pytest
import yaml
from chartlib import EXAMPLES_DIR, TOP_CRDS_DIR, crd_files

EXAMPLES = sorted(p.name for p in EXAMPLES_DIR.glob("*.yaml"))


def crd_schemas():
    """(apiVersion, kind) -> strict openAPIV3Schema of the served version."""
    files = crd_files(TOP_CRDS_DIR)
    if not files:
        pytest.skip("crds/ holds no generated CRDs yet (the operator's crdgen writes them)")
    schemas = {}
    for text in files.values():
        for crd in yaml.safe_load_all(text):
            if not crd:
                continue
            for version in crd["spec"]["versions"]:
                api_version = f"{crd['spec']['group']}/{version['name']}"
                schemas[(api_version, crd["spec"]["names"]["kind"])] = strict(version["schema"]["openAPIV3Schema"])
    return schemas


def strict(schema):
    """Closes every object schema that does not preserve unknown fields, like the API server's
    strict field validation; metadata is checked by the API server itself, so it stays open."""
    schema = copy.deepcopy(schema)
    # The API server adds these to every CRD's root schema implicitly.
    schema["properties"].setdefault("apiVersion", {"type": "string"})
    schema["properties"].setdefault("kind", {"type": "string"})
    schema["properties"].setdefault("metadata", {"type": "object"})

    def close(node, is_root):
        if isinstance(node, dict):
            if (
                "properties" in node
                and "additionalProperties" not in node
                and not node.get("x-kubernetes-preserve-unknown-fields")
            ):
                node["additionalProperties"] = False
            for key, child in node.items():
                if is_root and key == "properties":
                    for name, prop in child.items():
                        if name != "metadata":
                            close(prop, False)
                else:
                    close(child, False)
        elif isinstance(node, list):
            for child in node:
                close(child, False)

    close(schema, True)
    return schema


def load(name):
    return yaml.safe_load((EXAMPLES_DIR / name).read_text())


def test_examples_cover_minimal_production_and_consumer_group():
    assert EXAMPLES == ["broker-minimal.yaml", "broker-production.yaml", "consumergroup.yaml"]
    production = load("broker-production.yaml")["spec"]
    assert production["replicas"] == 3
    assert production["flushDiskType"] == "SYNC"
    assert production["storage"]["storageClassName"]
    assert production["resources"]["requests"] and production["resources"]["limits"]
    group = load("consumergroup.yaml")["spec"]
    assert group["brokerRef"] == load("broker-production.yaml")["metadata"]["name"]
    assert group["lagThresholds"]["messages"] > 0 and group["lagThresholds"]["seconds"] > 0


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_is_valid_against_its_crd_schema(name):
    schemas = crd_schemas()
    resource = load(name)
    schema = schemas[(resource["apiVersion"], resource["kind"])]
    jsonschema.validate(resource, schema)


def test_crd_schema_rejects_a_misspelt_field():
    schemas = crd_schemas()
    resource = load("broker-production.yaml")
    resource["spec"]["flushDiskTyp"] = resource["spec"].pop("flushDiskType")
    with pytest.raises(jsonschema.ValidationError, match="flushDiskTyp"):
        jsonschema.validate(resource, schemas[(resource["apiVersion"], resource["kind"])])
