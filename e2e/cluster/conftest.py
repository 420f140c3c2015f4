"""Fixtures: a namespace, the CRDs and the operator (Helm chart), and a toolbox pod holding the
quiver CLI so clients run inside the cluster where broker DNS names resolve."""

import os
import shutil
import uuid

import pytest

from kube import (REPO, apply, drop_finalizers, kubectl, list_objects, run, split_image,
                  wait_for)
from scenario import QuiverCli, remove_broker

REASONS = []
if not os.environ.get("KUBECONFIG"):
    REASONS.append("KUBECONFIG is not set: no cluster to test against")
for tool in ("kubectl", "helm"):
    if shutil.which(tool) is None:
        REASONS.append(f"{tool} is not installed")
for image_var in ("QUIVER_OPERATOR_IMAGE", "QUIVER_BROKER_IMAGE"):
    if not os.environ.get(image_var):
        REASONS.append(f"{image_var} is not set (an image the cluster can pull)")
CLI = os.path.join(os.environ.get("QUIVER_BIN_DIR", ""), "quiver")
if not os.access(CLI, os.X_OK):
    REASONS.append(f"no quiver CLI at {CLI} (set QUIVER_BIN_DIR)")

# Debian 13 matches the glibc of the CLI built on the development machines.
TOOLBOX_IMAGE = os.environ.get("QUIVER_E2E_TOOLBOX_IMAGE", "debian:trixie-slim")
RELEASE = "qe2e"


def pytest_collection_modifyitems(config, items):
    if REASONS:
        skip = pytest.mark.skip(reason="; ".join(REASONS))
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def namespace():
    name = f"quiver-e2e-{uuid.uuid4().hex[:8]}"
    run("kubectl", "create", "namespace", name)
    try:
        yield name
    finally:
        try:
            release_consumer_groups(name)
        except AssertionError as error:  # e.g. the CRDs never got installed
            print(f"cleanup: could not release ConsumerGroups: {error}")
        run("helm", "uninstall", RELEASE, "--namespace", name, check=False)
        run("kubectl", "delete", "namespace", name, "--wait=false", check=False)


def release_consumer_groups(namespace):
    """ConsumerGroups carry the operator's finalizer: delete them while the operator runs, and
    drop the finalizer of any left, or the namespace would stay Terminating forever."""
    kubectl(namespace, "delete", "consumergroups", "--all", "--timeout=120s", check=False,
            timeout=150)
    for group in list_objects(namespace, "consumergroups"):
        name = group["metadata"]["name"]
        print(f"cleanup: ConsumerGroup {name} still there; removing its finalizer")
        drop_finalizers(namespace, "consumergroup", name)


@pytest.fixture(scope="session")
def operator(namespace):
    run("kubectl", "apply", "--server-side", "-f", str(REPO / "crds"))
    repository, tag = split_image(os.environ["QUIVER_OPERATOR_IMAGE"])
    run(
        "helm", "upgrade", "--install", RELEASE, str(REPO / "charts" / "quiver-operator"),
        "--namespace", namespace,
        "--set", f"image.repository={repository}",
        "--set", f"image.tag={tag}",
        "--set", f"watchNamespace={namespace}",
        "--set", "lagIntervalSeconds=5",
        "--wait", "--timeout", "180s",
        timeout=240,
    )
    return f"{RELEASE}-quiver-operator"


@pytest.fixture(scope="session")
def toolbox(namespace):
    kubectl(namespace, "run", "toolbox", f"--image={TOOLBOX_IMAGE}", "--restart=Never",
            "--command", "--", "sleep", "infinity")
    kubectl(namespace, "wait", "--for=condition=Ready", "pod/toolbox", "--timeout=180s", timeout=200)
    kubectl(namespace, "cp", CLI, "toolbox:/tmp/quiver")
    kubectl(namespace, "exec", "toolbox", "--", "chmod", "0755", "/tmp/quiver")

    def quiver(*args, timeout=120):
        return kubectl(namespace, "exec", "toolbox", "--", "/tmp/quiver",
                       "--server", f"qb.{namespace}.svc:10911", *args, timeout=timeout)

    wait_for("the toolbox to run the CLI", lambda: quiver("--help"), 30)
    return quiver


@pytest.fixture(scope="session")
def cli(namespace, toolbox):
    """The quiver CLI in the toolbox pod: `cli(broker, *args)` against that Broker's Service."""
    return QuiverCli(namespace)


@pytest.fixture
def brokers(namespace, operator):
    """Applies Broker manifests for one test and removes them (and their groups) after it."""
    created = []

    def create(manifest):
        apply(namespace, manifest)
        created.append(manifest["metadata"]["name"])
        return manifest["metadata"]["name"]

    yield create
    for name in reversed(created):
        remove_broker(namespace, name)
