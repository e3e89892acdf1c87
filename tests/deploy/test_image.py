"""The images, built with podman from the root Dockerfile and run the way the Kubernetes manifest runs the sidecar.

tests/deploy/test_docker.py mirrors the Dockerfile's install steps in a venv; this module builds the
images themselves (see tests/support/podman.py for how, without a registry) and runs the sidecar
under the manifest's securityContext, limits and read-only spool. ``make test`` installs podman,
runc, slirp4netns and mmdebstrap; without podman the module is skipped, saying so. It needs root
(rootful podman). Measured figures go to ``<cache>/last-timings.json`` (docs/deploy.md records them).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from modelkv_exporter.contract.spool import write_snapshot
from modelkv_testbed import ROOT
from modelkv_testbed.exposition import Exposition
from modelkv_testbed.polling import eventually
from modelkv_testbed.processes import require_tool
from modelkv_testbed.snapshots import make_snapshot
from tests.support.podman import (
    CACHE,
    PACKAGES,
    PYTHON_OF_SUITE,
    STORE_LIMIT_BYTES,
    ManifestContainer,
    Podman,
    base_recipe,
    ensure_base,
    locked,
    manifest_container,
    podman_version,
    qualified,
    storage_driver,
)

DOCKERFILE = ROOT / "Dockerfile"
MANIFEST = ROOT / "deploy" / "kubernetes" / "base" / "deployment.yaml"
SIDECAR = "modelkv-exporter"
"""The sidecar's container name in the manifest."""
ENGINE_STAND_IN = "localhost/modelkv-test-engine-base:stand-in"
HEAVY = ("torch", "vllm", "transformers", "numpy", "triton", "pip")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("podman") is None,
        reason="podman is not installed: the README's test command (make test) installs " + " ".join(PACKAGES),
    ),
]

TIMINGS: dict[str, Any] = {}


def dockerfile_arg(name: str) -> str:
    """The default of ``ARG name=...`` in the Dockerfile."""
    match = re.search(rf"^ARG {name}=(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, f"the Dockerfile has no ARG {name}"
    return match.group(1)


def sidecar_spec() -> ManifestContainer:
    return manifest_container(yaml.safe_load(MANIFEST.read_text()), SIDECAR)


@pytest.fixture(scope="module")
def podman() -> Iterator[Podman]:
    """podman on this module's store, with the Dockerfile's python base imported under its FROM name."""
    if os.geteuid() != 0:
        pytest.skip("these tests drive rootful podman: run them as root (CI's machine, make test in a container)")
    for package in PACKAGES[1:]:
        require_tool(package)
    python_image = qualified(dockerfile_arg("PYTHON_IMAGE"))
    tag = re.fullmatch(r"docker\.io/library/python:(\d+\.\d+)[.\d]*-slim-(\w+)", python_image)
    assert tag, f"no Debian stand-in for {python_image}: expected python:X.Y-slim-<suite>"
    version, suite = tag.groups()
    assert PYTHON_OF_SUITE.get(suite) == version, f"Debian {suite}'s python3 cannot stand in for {python_image}"

    recipe = base_recipe(suite)
    driver = storage_driver()
    tool = Podman(CACHE / f"store-{recipe.key}-{driver}-{podman_version()}", driver)
    forwarding = Path("/proc/sys/net/ipv4/ip_forward").read_text()
    start = time.monotonic()
    with locked(CACHE / f"store-{recipe.key}.lock"):
        ensure_base(tool, recipe, CACHE / f"base-{recipe.key}.tar", python_image, TIMINGS)
    TIMINGS["base_ready_s"] = round(time.monotonic() - start, 1)
    TIMINGS["base_size_bytes"] = tool.image_size(python_image)
    tool.remove_orphaned_containers()
    try:
        yield tool
    finally:
        tool.remove_session_containers()
        tool.sweep_sockets()
        tool.prune_if_larger_than(STORE_LIMIT_BYTES)
        TIMINGS["storage_driver"] = driver
        (CACHE / "last-timings.json").write_text(json.dumps(TIMINGS, indent=2) + "\n")
        assert Path("/proc/sys/net/ipv4/ip_forward").read_text() == forwarding, "IP forwarding changed"


def build(podman: Podman, *args: str) -> None:
    with locked(podman.home / "build.lock"):
        podman("build", "--pull=never", "--network=host", f"--file={DOCKERFILE}", *args, str(ROOT))


@pytest.fixture(scope="module")
def sidecar_image(podman: Podman) -> str:
    """The Dockerfile's default target, tagged as the manifest's sidecar image."""
    reference = sidecar_spec().spec["image"]
    start = time.monotonic()
    build(podman, f"--tag={reference}")
    TIMINGS["build_sidecar_s"] = round(time.monotonic() - start, 1)
    image_id = podman("image", "inspect", "--format={{.Id}}", reference).stdout.strip()
    TIMINGS["sidecar_size_bytes"] = podman.image_size(image_id)
    return image_id


@pytest.fixture(scope="module")
def engine_image(podman: Podman, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The Dockerfile's engine target on a stand-in engine base: the python base, where pip may install.

    Debian's python3 is PEP 668 "externally managed"; the vLLM images' python is not, so the
    stand-in drops that marker. It is tagged as a local stand-in, never as a vLLM image.
    """
    context = tmp_path_factory.mktemp("engine-base")
    (context / "Containerfile").write_text(
        f"FROM {qualified(dockerfile_arg('PYTHON_IMAGE'))}\nRUN rm -f /usr/lib/python3*/EXTERNALLY-MANAGED\n"
    )
    reference = "localhost/modelkv-test-engine:test"
    start = time.monotonic()
    podman("build", "--pull=never", "--network=none", f"--tag={ENGINE_STAND_IN}", str(context))
    build(podman, "--target=engine", f"--build-arg=ENGINE_IMAGE={ENGINE_STAND_IN}", f"--tag={reference}")
    TIMINGS["build_engine_s"] = round(time.monotonic() - start, 1)
    return reference


@dataclass
class Running:
    """The sidecar container, its URL on the host's loopback, and podman to look inside it."""

    name: str
    url: str
    podman: Podman
    probe_url: str = ""
    """The port the manifest's probes ask (the liveness listener)."""

    def get(self, path: str, *, probe: bool = False) -> httpx.Response:
        with httpx.Client(trust_env=False, timeout=5) as client:  # never a proxy for loopback
            return client.get((self.probe_url if probe else self.url) + path)

    def exec(self, *command: str, check: bool = True) -> str:
        return self.podman("exec", self.name, *command, check=check).stdout

    def status(self) -> dict[str, str]:
        """``/proc/1/status`` of the container's process."""
        lines = self.exec("cat", "/proc/1/status").splitlines()
        return {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}


@pytest.fixture(scope="module")
def sidecar(podman: Podman, sidecar_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The sidecar image run as the manifest runs it, over a spool with one engine, until /healthz answers."""
    spool = tmp_path_factory.mktemp("spool")
    spool.chmod(0o755)  # the container's user does not own it
    write_snapshot(spool, make_snapshot("engine-a"))
    spec = sidecar_spec()
    name = f"modelkv-test-{podman.session}"
    start = time.monotonic()
    try:
        podman.run_container(
            "--detach",
            f"--name={name}",
            f"--publish=127.0.0.1::{spec.port}",  # loopback only; podman picks the host port
            f"--publish=127.0.0.1::{spec.probe_port}",
            *spec.podman_args(spool),
            sidecar_image,
            network="slirp4netns:port_handler=slirp4netns",
        )

        def url(port: int) -> str:
            return "http://127.0.0.1:" + podman("port", name, f"{port}/tcp").stdout.strip().rsplit(":", 1)[1]

        running = Running(name, url(spec.port), podman, url(spec.probe_port))

        def healthy() -> bool:
            state = podman("inspect", "--format={{.State.Status}}", name).stdout.strip()
            assert state == "running", f"the sidecar is {state}:\n{podman('logs', name, check=False).stderr[-3000:]}"
            try:
                return running.get("/healthz", probe=True).status_code == 200
            except httpx.HTTPError:
                return False

        eventually(
            healthy,
            "/healthz on the probes' port within the seconds the startupProbe allows",
            timeout=spec.startup_seconds,
            interval=0.05,
        )
        TIMINGS["run_to_first_healthz_s"] = round(time.monotonic() - start, 2)
        yield running
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)


def test_the_sidecar_image_is_the_dockerfiles_and_small(podman: Podman, sidecar_image: str) -> None:
    config = json.loads(podman("image", "inspect", sidecar_image).stdout)[0]["Config"]
    spec = sidecar_spec()
    assert config["User"] == f"{spec.security['runAsUser']}:{spec.security['runAsGroup']}"
    assert config["Entrypoint"] == ["modelkv-exporter", "serve"]
    assert set(config["ExposedPorts"]) == {f"{port['containerPort']}/tcp" for port in spec.spec["ports"]}
    version = re.search(r'^version = "([^"]+)"', (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert version and config["Labels"]["org.opencontainers.image.version"] == version.group(1)
    assert spec.spec["image"].endswith(":" + version.group(1)), "the manifest runs this version's image"
    added = podman.image_size(sidecar_image) - podman.image_size(qualified(dockerfile_arg("PYTHON_IMAGE")))
    TIMINGS["sidecar_added_bytes"] = added
    assert 0 < added < 64 * 2**20, f"the sidecar's venv adds {added / 2**20:.1f} MiB to the base"


def test_the_sidecar_serves_metrics_and_probes_under_the_manifests_limits(sidecar: Running) -> None:
    assert sidecar_spec().probe_port != sidecar_spec().port, "the kubelet probes the liveness listener"
    for probe in (True, False):
        health = sidecar.get("/healthz", probe=probe)
        assert (health.status_code, health.text) == (200, "ok\n")
    assert sidecar.get("/readyz").status_code == 200, "the read-only spool can be listed"
    metrics = sidecar.get("/metrics")
    assert metrics.status_code == 200
    exposition = Exposition(metrics.text)
    assert exposition.value("modelkv_engine_up", engine="engine-a") == 1
    assert exposition.all("modelkv_declared_peak_bytes", engine="engine-a", cache="cache")
    assert exposition.value("modelkv_exporter_spool_scan_success") == 1


def confinement_problems(podman: Podman, name: str, spec: ManifestContainer) -> list[str]:
    """How the running container ``name`` falls short of the manifest's securityContext and limits."""
    lines = podman("exec", name, "cat", "/proc/1/status").stdout.splitlines()
    status = {key: value.strip() for key, _, value in (line.partition(":") for line in lines)}
    problems = []
    uid, gid = str(spec.security["runAsUser"]), str(spec.security["runAsGroup"])
    if status["Uid"].split() != [uid] * 4 or status["Gid"].split() != [gid] * 4:
        problems.append(f"runs as uid/gid {status['Uid']} / {status['Gid']}")
    if status["Groups"].split() not in ([gid], []):
        problems.append(f"supplementary groups {status['Groups']}")
    problems += [f"{c} {status[c]}" for c in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb") if int(status[c], 16)]
    if status["NoNewPrivs"] != "1":
        problems.append("may gain privileges")
    if status["Seccomp"] != "2":
        problems.append("no seccomp filter")
    for path in ("/probe", "/tmp/probe", "/opt/modelkv/probe", f"{spec.mount['mountPath']}/probe"):
        touched = podman("exec", name, "sh", "-c", f": > {path}", check=False)
        if touched.returncode == 0 or "Read-only file system" not in touched.stderr:
            problems.append(f"{path} is writable or missing: {touched.stderr.strip()}")
    host = json.loads(podman("inspect", name).stdout)[0]["HostConfig"]
    if not host["Memory"] == host["MemorySwap"] == spec.memory_limit:
        problems.append(f"memory {host['Memory']}, with swap {host['MemorySwap']}")
    if host["NanoCpus"] != int(spec.cpu_limit * 1e9):
        problems.append(f"{host['NanoCpus']} nano-CPUs")
    cgroup = "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
    limit = podman("exec", name, "sh", "-c", cgroup).stdout.strip()
    if limit != str(spec.memory_limit):
        problems.append(f"the container's cgroup allows {limit} bytes")
    return problems


def test_the_sidecar_runs_unprivileged_read_only_and_confined(sidecar: Running) -> None:
    assert confinement_problems(sidecar.podman, sidecar.name, sidecar_spec()) == []


def test_the_confinement_check_catches_a_container_run_without_the_manifests_settings(
    podman: Podman, sidecar_image: str
) -> None:
    """The same image run plainly (root, default capabilities, writable, unlimited) fails every check above."""
    name = f"modelkv-test-plain-{podman.session}"
    try:
        podman.run_container("--detach", f"--name={name}", "--user=0:0", sidecar_image, network="none")
        problems = " | ".join(confinement_problems(podman, name, sidecar_spec()))
    finally:
        podman("rm", "-f", "-t", "0", name, check=False)
    for expected in ("runs as uid/gid 0", "CapEff", "may gain privileges", "/probe is writable", "memory 0"):
        assert expected in problems, expected


def heavy_packages(podman: Podman, *where: str) -> list[str]:
    """Which of ``HEAVY`` the python at ``where`` (``exec NAME PYTHON`` or ``run IMAGE PYTHON``) can import."""
    find = f"import importlib.util as u; print(*[m for m in {HEAVY!r} if u.find_spec(m)])"
    if where[0] == "run":
        return podman.run_container("--rm", *where[1:], "-c", find, network="none").stdout.split()
    return podman("exec", *where[1:], "-c", find).stdout.split()


def test_the_image_holds_no_torch_vllm_transformers_or_pip(podman: Podman, sidecar: Running) -> None:
    assert sidecar.exec("python", "-c", "import sys; print(sys.prefix)").strip() == "/opt/modelkv"
    assert heavy_packages(podman, "exec", sidecar.name, "python") == [], "in the sidecar's venv"
    base_python = sidecar.exec("sh", "-c", "ls /usr/local/bin/python3 /usr/bin/python3 2>/dev/null | head -1").strip()
    assert heavy_packages(podman, "exec", sidecar.name, base_python) == [], "in the base image's python"
    assert sidecar.exec("sh", "-c", "command -v pip pip3 || true").strip() == "", "no pip on PATH"
    assert "pip" in heavy_packages(podman, "run", qualified(dockerfile_arg("PYTHON_IMAGE")), "python3"), (
        "the check sees pip where the base image has it"
    )
    listed = sidecar.exec(
        "python", "-c", "import importlib.metadata as m; print(' '.join(d.metadata['Name'] for d in m.distributions()))"
    ).split()
    pinned = {
        line.split("==")[0].lower().replace("_", "-")
        for line in (ROOT / "requirements" / "sidecar.txt").read_text().splitlines()
        if "==" in line
    }
    assert {name.lower().replace("_", "-") for name in listed} == pinned | {"modelkv-exporter"}


def test_the_sidecars_memory_stays_under_the_manifests_request(sidecar: Running) -> None:
    request = sidecar_spec().memory_request
    TIMINGS["rss_at_start_bytes"] = int(sidecar.status()["VmRSS"].split()[0]) * 1024
    for _ in range(20):
        assert sidecar.get("/metrics").status_code == 200
    for path in ("/", "/api/v1/engines"):
        assert sidecar.get(path).status_code == 200
    status = sidecar.status()
    rss, peak = (int(status[key].split()[0]) * 1024 for key in ("VmRSS", "VmHWM"))
    TIMINGS["rss_after_requests_bytes"], TIMINGS["rss_peak_bytes"] = rss, peak
    assert peak < request, f"peak RSS {peak / 2**20:.1f} MiB; the manifest requests {request / 2**20:.0f} MiB"


def test_the_engine_target_registers_the_vllm_plugin(podman: Podman, engine_image: str) -> None:
    check = (
        "import importlib.metadata as m\n"
        "(ep,) = [e for e in m.entry_points(group='vllm.general_plugins') if e.name == 'modelkv_exporter']\n"
        "assert callable(ep.load()), ep\n"
        "print(ep.value)\n"
    )
    result = podman.run_container("--rm", engine_image, "python3", "-c", check, network="none")
    assert result.stdout.strip() == "modelkv_exporter.engine.vllm_hook.plugin:register", result.stdout
    listing = (
        "import importlib.metadata as m; print(' '.join(sorted(f'{d.name}=={d.version}' for d in m.distributions())))"
    )
    before, after = (
        set(podman.run_container("--rm", image, "python3", "-c", listing, network="none").stdout.split())
        for image in (ENGINE_STAND_IN, engine_image)
    )
    added = {name.partition("==")[0] for name in after - before}
    assert added == {"modelkv-exporter"} and before <= after, f"the hook adds itself and nothing else: {after - before}"
