"""Install torch for ``make demo``: PyTorch's CPU build where it publishes one, else what pip finds; say which first.

    python scripts/install_torch.py VERSION [INDEX]

Run with the Python of the environment to install into (the Makefile runs ``.venv/bin/python``):

- a torch this Python already imports is kept as it is (a local build, a CUDA build chosen on purpose);
- on Linux x86_64 and aarch64, INDEX (PyTorch's CPU index, https://download.pytorch.org/whl/cpu) is
  added to pip's indexes when it answers: its ``VERSION+cpu`` build, some 180 MB, sorts above PyPI's
  ``VERSION``, which on Linux x86_64 is the CUDA build, 2.6 GB with its CUDA libraries;
- otherwise (INDEX empty, unreachable, another platform) pip takes torch from its own indexes and
  find-links: a local wheel in a directory named by ``PIP_FIND_LINKS`` is found there.

pip first resolves torch alone without installing (``--dry-run``), so the line printed before the
download names the build and where it comes from, and warns when it is the CUDA build.
"""

from __future__ import annotations

import importlib.util
import json
import platform
import subprocess
import sys
import urllib.error
import urllib.request

CPU_INDEX_PLATFORMS = frozenset({("linux", "x86_64"), ("linux", "aarch64")})
"""Where PyTorch's CPU index has builds and PyPI's default build is not already the CPU one everywhere."""
PROBE_TIMEOUT_SECONDS = 15.0
PIP = [sys.executable, "-m", "pip"]


def say(line: str) -> None:
    """One line of progress, as the Makefile's own lines read."""
    print(f"make demo: {line}", flush=True)


def index_answers(index: str) -> str | None:
    """Why ``index`` cannot be used now, or ``None`` when its torch page answers."""
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=PROBE_TIMEOUT_SECONDS) as response:
            response.read(1)
    except (urllib.error.URLError, OSError, ValueError) as error:
        return str(getattr(error, "reason", error))
    return None


def chosen(requirement: str, extra: list[str]) -> tuple[str, str]:
    """The version and the address of the torch wheel pip would install now, resolved without installing."""
    result = subprocess.run(
        [*PIP, "install", "--dry-run", "--quiet", "--no-deps", "--report", "-", *extra, requirement],
        capture_output=True,
        text=True,
        check=True,
    )
    item = json.loads(result.stdout)["install"][0]
    return item["metadata"]["version"], item["download_info"]["url"]


def main(argv: list[str]) -> int:
    """Install torch ``argv[0]`` into this Python's environment, from ``argv[1]`` where it helps."""
    version, index = argv[0], (argv[1] if len(argv) > 1 else "")
    if importlib.util.find_spec("torch") is not None:
        from importlib.metadata import version as installed

        say(f"keeping the torch already installed here ({installed('torch')})")
        return 0
    extra: list[str] = []
    where = (sys.platform, platform.machine().lower())
    if index and where in CPU_INDEX_PLATFORMS:
        reason = index_answers(index)
        if reason is None:
            extra = ["--extra-index-url", index]
        else:
            say(f"PyTorch's CPU index {index} does not answer ({reason}); using pip's own indexes and find-links")
    requirement = f"torch=={version}"
    try:
        build, url = chosen(requirement, extra)
    except (subprocess.CalledProcessError, KeyError, IndexError, ValueError) as error:
        output = getattr(error, "stderr", "") or str(error)
        say(f"pip cannot find {requirement}:\n{output.strip()}")
        return 1
    if where == ("linux", "x86_64") and "+cpu" not in build:
        say(
            f"torch {build} here is the CUDA build, about 2.6 GB with its CUDA libraries; the demo needs only the "
            "CPU build: stop now (Ctrl-C) and put its wheel in a directory named by PIP_FIND_LINKS, "
            "or set TORCH_INDEX to a reachable copy of PyTorch's CPU index"
        )
    say(f"installing torch {build} from {url}")
    return subprocess.run([*PIP, "install", *extra, requirement]).returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
