"""Building and running the Dockerfile's images with podman, on a private store, without an image registry.

Used by tests/deploy/test_image.py. No registry can be reached, so the python base the Dockerfile's
``FROM`` names is made with mmdebstrap from Debian's archive (python3, python3-venv, python3-pip,
ca-certificates, and the host's extra CA certificates, since HTTPS may pass a TLS-intercepting proxy)
and imported under that exact name. This proves the Dockerfile and the runtime hardening, not the
official python or vLLM images.

Isolation: podman runs on its own store under the cache directory (never /var/lib/containers), its
run-time state in a short directory under /tmp (overlay wants a runroot under 50 characters, sockets
stay under 108), with runc (Debian's crun refuses hybrid cgroups) and cgroupfs. Every container names
its network: ``host`` only for a build whose pip needs the index, ``slirp4netns`` with a loopback-only
published port or ``none`` for runs, so podman's default bridge (iptables chains, IP forwarding) is
never created. Every container carries a label with the test process's id and is removed.

Cache (``MODELKV_PODMAN_CACHE``, default ``~/.cache/modelkv-exporter/podman``): the base tarball,
keyed by a hash of the mmdebstrap recipe, the apt sources and the CA certificates it uses, rebuilt
after ``BASE_MAX_AGE_SECONDS`` so Debian's security updates come in; and the podman store (the base
image and the build layers), keyed by the same hash, the storage driver and podman's version, pruned
of dangling images once it passes ``STORE_LIMIT_BYTES``. Delete the directory to start cold.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import re
import resource
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("MODELKV_PODMAN_CACHE", Path.home() / ".cache" / "modelkv-exporter" / "podman"))
BASE_MAX_AGE_SECONDS = 7 * 86400
STORE_LIMIT_BYTES = 2 * 2**30
LABEL = "io.github.modelkv-exporter.test"
RECIPE_VERSION = 1
"""Bump when the base recipe changes in a way its cache key does not see."""
PYTHON_OF_SUITE = {"bullseye": "3.9", "bookworm": "3.11", "trixie": "3.13"}
PACKAGES = ("podman", "runc", "slirp4netns", "mmdebstrap")
"""What the Makefile's system-deps installs for these tests."""


def qualified(reference: str) -> str:
    """A short image name as Docker resolves it: ``python:3.11`` -> ``docker.io/library/python:3.11``."""
    first = reference.split("/")[0]
    if "/" in reference and ("." in first or ":" in first or first == "localhost"):
        return reference
    return "docker.io/" + (reference if "/" in reference else "library/" + reference)


def quantity(value: str | int) -> float:
    """A Kubernetes quantity (``192Mi``, ``500m``, ``1``) as a number (bytes, cores)."""
    text = str(value)
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "k": 1e3, "M": 1e6, "G": 1e9, "m": 1e-3}
    for suffix, factor in units.items():
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * factor
    return float(text)


@dataclass
class ManifestContainer:
    """One container of the Kubernetes manifest, and the podman arguments that reproduce how it runs."""

    spec: dict[str, Any]

    @property
    def security(self) -> dict[str, Any]:
        """Its securityContext."""
        return dict(self.spec["securityContext"])

    @property
    def port(self) -> int:
        """Its first containerPort."""
        return int(self.spec["ports"][0]["containerPort"])

    @property
    def probe_port(self) -> int:
        """The containerPort its startupProbe and livenessProbe ask (by name or number; both the same)."""
        ports = {probe["httpGet"]["port"] for probe in (self.spec["startupProbe"], self.spec["livenessProbe"])}
        (port,) = ports
        if isinstance(port, int):
            return port
        (number,) = [int(p["containerPort"]) for p in self.spec["ports"] if p.get("name") == port]
        return number

    @property
    def mount(self) -> dict[str, Any]:
        """Its one volume mount (the spool)."""
        (mount,) = self.spec["volumeMounts"]
        return dict(mount)

    @property
    def memory_limit(self) -> int:
        """Its memory limit in bytes."""
        return int(quantity(self.spec["resources"]["limits"]["memory"]))

    @property
    def memory_request(self) -> int:
        """Its memory request in bytes."""
        return int(quantity(self.spec["resources"]["requests"]["memory"]))

    @property
    def cpu_limit(self) -> float:
        """Its CPU limit in cores."""
        return quantity(self.spec["resources"]["limits"]["cpu"])

    @property
    def startup_seconds(self) -> float:
        """Seconds the startupProbe allows before the kubelet restarts the container."""
        probe = self.spec["startupProbe"]
        return float(probe["periodSeconds"] * probe["failureThreshold"])

    def podman_args(self, volume: Path) -> list[str]:
        """``podman run`` arguments for its securityContext, limits, environment and ``volume`` as its mount."""
        security = self.security
        assert security["runAsNonRoot"] and security["runAsUser"] != 0
        assert security["capabilities"] == {"drop": ["ALL"]}, "only 'drop ALL' is mapped"
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}, "podman's default profile stands in"
        args = [f"--user={security['runAsUser']}:{security['runAsGroup']}", "--cap-drop=ALL"]
        if security.get("readOnlyRootFilesystem"):
            # Kubernetes mounts no tmpfs on /tmp or /run; podman's --read-only would, unless told not to.
            args += ["--read-only", "--read-only-tmpfs=false"]
        if security.get("allowPrivilegeEscalation") is False:
            args.append("--security-opt=no-new-privileges")
        # The kubelet gives a container no swap (swap limit = memory limit); podman would allow twice the limit.
        args += [f"--memory={self.memory_limit}b", f"--memory-swap={self.memory_limit}b", f"--cpus={self.cpu_limit}"]
        args += [f"--env={env['name']}={env['value']}" for env in self.spec.get("env", [])]
        mount = self.mount
        args.append(f"--volume={volume}:{mount['mountPath']}" + (":ro" if mount.get("readOnly") else ""))
        return args


def manifest_container(deployment: dict[str, Any], name: str) -> ManifestContainer:
    """The container (or init container) called ``name`` of a Deployment."""
    pod = deployment["spec"]["template"]["spec"]
    (spec,) = [c for c in pod.get("initContainers", []) + pod["containers"] if c["name"] == name]
    return ManifestContainer(spec)


@dataclass
class Podman:
    """``podman`` on a private store, with runc and cgroupfs; every container started is labelled and removed."""

    home: Path
    driver: str
    session: str = field(default_factory=lambda: f"{os.getpid()}-{uuid.uuid4().hex[:8]}")

    @property
    def state(self) -> Path:
        """Run-time state (sockets, locks): short, and stable per store, since podman's database records it."""
        return Path("/tmp") / f"mkvp-{hashlib.sha256(str(self.home).encode()).hexdigest()[:12]}"

    def __call__(self, *args: str, check: bool = True, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        """Run ``podman ARGS`` on this store; a failure raises with podman's output when ``check``."""
        for directory in (self.home / "store", self.home / "vartmp", self.home / "volumes", self.state):
            directory.mkdir(parents=True, exist_ok=True)
        command = [
            "podman",
            f"--root={self.home / 'store'}",
            f"--runroot={self.state / 'run'}",
            f"--tmpdir={self.state / 'tmp'}",
            f"--volumepath={self.home / 'volumes'}",
            f"--storage-driver={self.driver}",
            "--runtime=runc",
            "--cgroup-manager=cgroupfs",
            "--events-backend=none",
            *args,
        ]
        env = {**os.environ, "TMPDIR": str(self.home / "vartmp")}  # import and build stage their blobs here
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(command)}\nexit {result.returncode}\n{result.stdout[-4000:]}{result.stderr[-4000:]}"
            )
        return result

    def run_container(self, *args: str, network: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """``podman run`` with a named network (never the default bridge) and limits the machine allows."""
        assert network == "none" or network.startswith("slirp4netns"), network
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        nproc = 32768 if nproc == resource.RLIM_INFINITY else min(32768, nproc)
        return self(
            "run",
            "--pull=never",
            f"--network={network}",
            f"--label={LABEL}={self.session}",
            # podman asks for rlimits above what a host without CAP_SYS_RESOURCE grants
            f"--ulimit=nofile={nofile}:{nofile}",
            f"--ulimit=nproc={nproc}:{nproc}",
            *args,
            check=check,
        )

    def remove_session_containers(self) -> None:
        """Remove every container this test process started."""
        ids = self("ps", "-a", "-q", f"--filter=label={LABEL}={self.session}", check=False).stdout.split()
        if ids:
            self("rm", "-f", "-t", "0", *ids, check=False)

    def remove_orphaned_containers(self) -> None:
        """Remove containers an earlier, killed test process left (the process id in their label is gone)."""
        listed = self("ps", "-a", f"--filter=label={LABEL}", "--format={{.ID}} {{.Labels}}", check=False).stdout
        for line in listed.splitlines():
            container, _, labels = line.partition(" ")
            owner = re.search(rf"{re.escape(LABEL)}:(\d+)-", labels)
            if owner and not Path(f"/proc/{owner.group(1)}").exists():
                self("rm", "-f", "-t", "0", container, check=False)
        self.sweep_sockets()

    def sweep_sockets(self) -> None:
        """podman 4.3 leaves slirp4netns's API socket (``<id>.net``) behind when it removes a container."""
        live = set(self("ps", "-a", "-q", "--no-trunc", check=False).stdout.split())
        for socket in (self.state / "tmp").glob("*.net"):
            if socket.stem not in live:
                socket.unlink(missing_ok=True)

    def prune_if_larger_than(self, limit: int) -> None:
        """Drop dangling images once the store passes ``limit`` bytes. Not on every run: the stage
        images a build reuses are dangling too, so pruning would cost the next build its cache."""
        used = subprocess.run(["du", "-sb", str(self.home / "store")], capture_output=True, text=True)
        if used.returncode == 0 and int(used.stdout.split()[0]) > limit:
            self("image", "prune", "--force", check=False)

    def image_size(self, reference: str) -> int:
        """An image's size in bytes, as ``podman images`` reports it."""
        return int(self("image", "inspect", "--format={{.Size}}", reference).stdout.strip())


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock across test processes that share the cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def storage_driver() -> str:
    """overlay when the kernel has it (about 1 s a container), else vfs (25 to 35 s)."""
    return "overlay" if "overlay" in Path("/proc/filesystems").read_text() else "vfs"


def podman_version() -> str:
    """podman's version, part of the store's key (stores do not move between versions)."""
    return subprocess.run(["podman", "--version"], capture_output=True, text=True, check=True).stdout.split()[-1]


def _sources(suite: str) -> tuple[str, list[str]]:
    """The apt sources for ``suite``: the host's file when the host runs that suite, else deb.debian.org's."""
    os_release = Path("/etc/os-release").read_text() if Path("/etc/os-release").exists() else ""
    host_suite = re.search(r"^VERSION_CODENAME=(\S+)", os_release, re.MULTILINE)
    if host_suite and host_suite.group(1) == suite:
        for candidate in (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list")):
            if candidate.is_file() and re.search(rf"^[^#]*\b{suite}\b", candidate.read_text(), re.MULTILINE):
                return candidate.read_text(), [str(candidate)]
    lines = [
        f"deb http://deb.debian.org/debian {suite} main",
        f"deb http://deb.debian.org/debian {suite}-updates main",
        f"deb http://deb.debian.org/debian-security {suite}-security main",
    ]
    return "\n".join(lines), lines


@dataclass(frozen=True)
class BaseRecipe:
    """How the python base is made: the mmdebstrap command (``OUTPUT`` marks the tarball) and its cache key."""

    command: tuple[str, ...]
    key: str

    def argv(self, output: Path) -> list[str]:
        """The command line writing to ``output``."""
        return [str(output) if arg == "OUTPUT" else arg for arg in self.command]


def base_recipe(suite: str) -> BaseRecipe:
    """A minimal Debian ``suite`` with python3, its venv and pip, and the host's extra CA certificates."""
    sources_text, sources_args = _sources(suite)
    certificates = sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
    hooks = []
    if certificates:
        hooks.append("copy-in " + " ".join(map(str, certificates)) + " /usr/local/share/ca-certificates/")
        hooks.append('chroot "$1" update-ca-certificates')
    hooks.append('rm -f "$1/etc/resolv.conf" "$1/etc/hostname"')  # the container gets its own
    command = (
        "mmdebstrap",
        "--quiet",
        "--variant=minbase",
        "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
        "--include=python3,python3-venv,python3-pip,python-is-python3,ca-certificates",
        *(f"--customize-hook={hook}" for hook in hooks),
        suite,
    )
    keyed = {
        "version": RECIPE_VERSION,
        "command": command,
        "sources": sources_text,
        "certificates": {str(c): hashlib.sha256(c.read_bytes()).hexdigest() for c in certificates},
        "arch": platform.machine(),
    }
    key = hashlib.sha256(json.dumps(keyed, sort_keys=True).encode()).hexdigest()[:16]
    return BaseRecipe((*command, "OUTPUT", *sources_args), key)


def ensure_base(tool: Podman, recipe: BaseRecipe, tarball: Path, image: str, timings: dict[str, Any]) -> None:
    """Make the base tarball unless a fresh one is cached, and import it as ``image`` unless the store has it."""
    if not tarball.exists() or time.time() - tarball.stat().st_mtime > BASE_MAX_AGE_SECONDS:
        partial = tarball.with_name(tarball.name + ".partial.tar")
        argv = recipe.argv(partial)
        start = time.monotonic()
        result = subprocess.run(argv, capture_output=True, text=True, timeout=1800)
        timings["base_mmdebstrap_s"] = round(time.monotonic() - start, 1)
        assert result.returncode == 0, f"{' '.join(argv)}\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
        os.replace(partial, tarball)
    stamp = f"{tarball.stat().st_size}:{tarball.stat().st_mtime_ns}:{image}"
    marker = tool.home / "base-imported"
    present = tool("image", "exists", image, check=False).returncode == 0
    if not present or not marker.exists() or marker.read_text() != stamp:
        start = time.monotonic()
        tool("import", "--change=ENV LANG=C.UTF-8", '--change=CMD ["python3"]', str(tarball), image)
        timings["base_import_s"] = round(time.monotonic() - start, 1)
        marker.write_text(stamp)
