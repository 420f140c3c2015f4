"""Static checks of the Dockerfiles (no container engine on the build machines): multi-stage,
non-root numeric user matching the chart, and they build binaries the workspace really has."""

import pathlib
import re
import tomllib

import pytest
from chartlib import CHART_DIR, REPO_ROOT, load_values

DOCKER_DIR = REPO_ROOT / "docker"
IMAGES = {
    "quiver-broker": "broker/server",
    "quiver-operator": "operator",
}


def instructions(dockerfile: pathlib.Path):
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


@pytest.mark.parametrize("binary,crate_dir", sorted(IMAGES.items()))
def test_dockerfile_builds_the_binary_in_a_builder_stage_and_runs_it_non_root(binary, crate_dir):
    lines = instructions(DOCKER_DIR / f"{binary}.Dockerfile")
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) == 2 and stages[0].endswith(" AS builder")
    assert stages[1].startswith("FROM gcr.io/distroless/cc-debian12:nonroot")
    final = lines[lines.index(stages[1]) :]
    (user,) = [line for line in final if line.startswith("USER ")]
    uid, gid = user.split()[1].split(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit() and int(gid) != 0
    chart_values = load_values(CHART_DIR / "values.yaml")
    assert int(uid) == chart_values["podSecurityContext"]["runAsUser"]
    (entrypoint,) = [line for line in final if line.startswith("ENTRYPOINT ")]
    assert entrypoint == f'ENTRYPOINT ["/usr/local/bin/{binary}"]'

    manifest = tomllib.loads((REPO_ROOT / crate_dir / "Cargo.toml").read_text())
    package = manifest["package"]["name"]
    assert binary in {b["name"] for b in manifest.get("bin", [])}
    (build,) = [line for line in lines if "cargo build" in line]
    assert f"-p {package} --bin {binary}" in build and "--locked" in build and "--release" in build


def test_broker_image_defaults_match_the_broker_contract():
    lines = instructions(DOCKER_DIR / "quiver-broker.Dockerfile")
    (cmd,) = [line for line in lines if line.startswith("CMD ")]
    assert cmd == 'CMD ["--data-dir", "/var/lib/quiver", "--listen", "0.0.0.0:10911", "--http-listen", "0.0.0.0:8080"]'
    assert "EXPOSE 10911 8081 8080" in lines


def test_chart_default_image_is_the_operator_dockerfile_image():
    text = (DOCKER_DIR / "quiver-operator.Dockerfile").read_text()
    repository = load_values(CHART_DIR / "values.yaml")["image"]["repository"]
    assert f"-t {repository}:" in text


def test_operator_default_broker_image_is_the_broker_dockerfile_image():
    text = (DOCKER_DIR / "quiver-broker.Dockerfile").read_text()
    (repository,) = re.findall(r"-t (\S+):\S+ \.", text)
    operator_sources = "\n".join(p.read_text() for p in (REPO_ROOT / "operator" / "src").rglob("*.rs"))
    assert f'"{repository}:' in operator_sources, f"the operator's default broker image is not {repository}"
