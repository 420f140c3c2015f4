"""The example Broker and ConsumerGroup manifests are valid against our CRD schemas (strict:
unknown fields are errors, as with kubectl's default server-side field validation); the Secrets
of the secure example against the Kubernetes schemas, and they hold what the Broker names."""

import copy

import jsonschema
import kubernetes_validate
import pytest
import yaml
from chartlib import EXAMPLES_DIR, KUBE_VERSIONS, TOP_CRDS_DIR, crd_files

EXAMPLES = sorted(p.name for p in EXAMPLES_DIR.glob("*.yaml"))
# Our own kinds, one per file; the others hold Secrets and a cert-manager Certificate.
CUSTOM_RESOURCE_EXAMPLES = [
    "broker-minimal.yaml",
    "broker-production.yaml",
    "broker-replicated.yaml",
    "broker-secure.yaml",
    "consumergroup.yaml",
]


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


def test_examples_cover_minimal_production_secure_and_consumer_group():
    assert EXAMPLES == sorted(CUSTOM_RESOURCE_EXAMPLES + ["certificate.yaml", "security-secrets.yaml"])
    production = load("broker-production.yaml")["spec"]
    assert production["replicas"] == 3
    assert production["flushDiskType"] == "SYNC"
    assert production["storage"]["storageClassName"]
    assert production["resources"]["requests"] and production["resources"]["limits"]
    group = load("consumergroup.yaml")["spec"]
    assert group["brokerRef"] == load("broker-production.yaml")["metadata"]["name"]
    assert group["lagThresholds"]["messages"] > 0 and group["lagThresholds"]["seconds"] > 0


@pytest.mark.parametrize("name", CUSTOM_RESOURCE_EXAMPLES)
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


def load_all(name):
    return [doc for doc in yaml.safe_load_all((EXAMPLES_DIR / name).read_text()) if doc]


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_the_secure_examples_secrets_are_valid_kubernetes_objects(kube_version):
    for secret in load_all("security-secrets.yaml"):
        kubernetes_validate.validate(secret, kube_version, strict=True)


def test_the_secure_example_names_secrets_that_hold_its_keys():
    security = load("broker-secure.yaml")["spec"]["security"]
    secrets = {s["metadata"]["name"]: s["stringData"] for s in load_all("security-secrets.yaml")}
    acl_file = yaml.safe_load(secrets[security["acl"]["secretName"]][security["acl"]["key"]])
    admin = secrets[security["adminCredentials"]["secretName"]]
    # The operator's account must be an admin account of the ACL file, with the same secret.
    (account,) = [a for a in acl_file["accounts"] if a["accessKey"] == admin["accessKey"]]
    assert account["admin"] is True and account["secretKey"] == admin["secretKey"]
    (certificate,) = load_all("certificate.yaml")
    assert certificate["apiVersion"] == "cert-manager.io/v1" and certificate["kind"] == "Certificate"
    assert certificate["spec"]["secretName"] == security["tls"]["secretName"]
    broker = load("broker-secure.yaml")["metadata"]["name"]
    # Routes hand out each broker's stable address: <broker>-<n>.<broker>-headless.<ns>.svc.
    assert any(name.startswith(f"*.{broker}-headless.") for name in certificate["spec"]["dnsNames"])
