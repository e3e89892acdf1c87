"""The plugin's import hook is invisible to the module it waits for and to whatever asks that module's loader.

A package imported from a zip archive (``zipimport``, so nothing can read its source from a file) is looked at
the same ways with the hook and without: its source, a traceback's source lines, its resources, ``is_package``,
its loader's type, a reload. Every answer must be the same.
"""

from __future__ import annotations

import importlib
import importlib.resources
import inspect
import json
import linecache
import os
import subprocess
import sys
import traceback
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from modelkv_exporter.engine.vllm_hook import imports
from modelkv_testbed import ROOT

PACKAGE = "modelkv_lent_loader_probe"
MODULE = f"{PACKAGE}.worker"
SOURCE = '''"""A module imported from a zip archive."""


def fails():
    raise ValueError("from inside the archive")  # the line a traceback shows
'''


@pytest.fixture
def archive(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "probe.zip"
    with zipfile.ZipFile(path, "w") as zipped:
        zipped.writestr(f"{PACKAGE}/__init__.py", '"""The package."""\n')
        zipped.writestr(f"{PACKAGE}/worker.py", SOURCE)
        zipped.writestr(f"{PACKAGE}/data.txt", "a resource")
    sys.path.insert(0, str(path))
    yield path
    sys.path.remove(str(path))
    forget()
    sys.path_importer_cache.pop(str(path), None)
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, imports.PatchOnImport)]


def forget() -> None:
    for name in (MODULE, PACKAGE):
        sys.modules.pop(name, None)
    linecache.clearcache()
    importlib.invalidate_caches()


def looked_at(package: Any, module: Any) -> dict[str, object]:
    """What code outside the module learns from its loader, each answer or the error it raised."""

    def answer(question: object) -> object:
        try:
            return question() if callable(question) else question
        except Exception as error:  # noqa: BLE001 - the error is the answer
            return f"{type(error).__name__}: {error}"

    def traceback_text() -> str:
        try:
            module.fails()
        except ValueError:
            return traceback.format_exc().split("Traceback", 1)[1].split("\n", 3)[-1]
        return "no error"

    return {
        "source": answer(lambda: inspect.getsource(module)),
        "function source": answer(lambda: inspect.getsource(module.fails)),
        "traceback": answer(traceback_text),
        "resource": answer(lambda: importlib.resources.files(PACKAGE).joinpath("data.txt").read_text()),
        "package is_package": answer(lambda: package.__loader__.is_package(PACKAGE)),
        "module is_package": answer(lambda: module.__spec__.loader.is_package(MODULE)),
        "loader types": (type(package.__loader__), type(module.__loader__), type(module.__spec__.loader)),
        "origin": module.__spec__.origin,
        "file": module.__file__,
        "reloaded": answer(lambda: importlib.reload(module).fails.__module__),
    }


def import_probe(hooked: bool) -> tuple[dict[str, object], list[str]]:
    loaded: list[str] = []
    if hooked:
        imports.on_import({name: lambda m: loaded.append(m.__name__) for name in (PACKAGE, MODULE)})
    module = importlib.import_module(MODULE)
    return looked_at(sys.modules[PACKAGE], module), loaded


def test_a_module_imported_through_the_hook_looks_the_same_to_everyone(archive: Path) -> None:
    without, _ = import_probe(hooked=False)
    assert without["source"] == SOURCE and "the line a traceback shows" in str(without["traceback"])
    assert without["resource"] == "a resource" and without["package is_package"] is True
    forget()
    hooked, loaded = import_probe(hooked=True)
    assert loaded == [PACKAGE, MODULE, MODULE], "each callback ran once its module had executed, and on its reload"
    assert hooked == without
    assert any(isinstance(f, imports.PatchOnImport) for f in sys.meta_path), "kept for reloads"


def test_the_module_meets_its_real_loader_while_it_executes(archive: Path) -> None:
    """The hook's loader never reaches the module's own code: ``__loader__`` is the real one from its first line."""
    with zipfile.ZipFile(archive, "a") as zipped:
        zipped.writestr(f"{PACKAGE}/early.py", "import zipimport\nSEEN = type(__loader__), type(__spec__.loader)\n")
    sys.path_importer_cache.pop(str(archive), None)
    imports.on_import({f"{PACKAGE}.early": lambda m: None})
    early = importlib.import_module(f"{PACKAGE}.early")
    assert early.SEEN == (type(sys.modules[PACKAGE].__loader__),) * 2
    sys.modules.pop(f"{PACKAGE}.early", None)


def test_a_failing_callback_does_not_fail_the_import(archive: Path) -> None:
    def broken(module: ModuleType) -> None:
        raise RuntimeError("a callback that breaks")

    imports.on_import({MODULE: broken})
    assert importlib.import_module(MODULE).fails.__name__ == "fails"


RELOAD = """
import importlib, json
import modelkv_exporter.engine.vllm_hook.plugin as plugin
plugin.register()
import vllm.v1.worker.gpu_worker as gpu_worker
import vllm.v1.worker.worker_base as worker_base
first, first_wrapper = gpu_worker.Worker, worker_base.WorkerWrapperBase
importlib.reload(gpu_worker)
importlib.reload(worker_base)

def hooked(cls):
    return [name for name in ("load_model", "initialize_from_config", "shutdown")
            if getattr(getattr(cls, name), plugin.MARKER, False)]

print("RELOADED", json.dumps({
    "new classes": [gpu_worker.Worker is not first, worker_base.WorkerWrapperBase is not first_wrapper],
    "first": hooked(first),
    "reloaded": hooked(gpu_worker.Worker),
    "init_worker": getattr(worker_base.WorkerWrapperBase.init_worker, plugin.MARKER, False),
}))
"""


@pytest.mark.slow
def test_a_reloaded_vllm_worker_module_is_hooked_again(tmp_path: Any) -> None:
    """vLLM's own worker modules, imported after ``register()`` and reloaded: the new classes are hooked too."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MODELKV_")}
    run = subprocess.run(
        [sys.executable, "-c", RELOAD],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, "MODELKV_SPOOL_DIR": str(tmp_path)},
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    line = next(line for line in run.stdout.splitlines() if line.startswith("RELOADED "))
    methods = ["load_model", "initialize_from_config", "shutdown"]
    assert json.loads(line.removeprefix("RELOADED ")) == {
        "new classes": [True, True],
        "first": methods,
        "reloaded": methods,
        "init_worker": True,
    }
