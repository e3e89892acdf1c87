"""vLLM-Omni 0.30's real GPU worker classes: the hook's wrappers sit on the classes that define each method.

vLLM-Omni's workers override ``init_device``, ``load_model``, ``initialize_from_config``,
``determine_available_memory``, ``compile_or_warm_up_model``, ``sleep`` and ``wake_up`` (not always calling
``super()``; their sleep drives the same ``CuMemAllocator`` vLLM's does): hooking the class vLLM builds must
wrap each override on the class that defines it. Run in a child process, so that the patched classes
never reach other tests; the classes are imported, never built (their ``init_device`` needs a GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from modelkv_testbed import ROOT

SCRIPT = """
import json, sys, tempfile
sys.path.insert(0, {site!r})
from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.vllm_hook import plugin
from vllm_omni.worker.gpu_ar_worker import GPUARWorker
from vllm_omni.worker.gpu_generation_worker import GPUGenerationWorker
import vllm.v1.worker.gpu_worker as gpu_worker

registration = plugin.Registration(HookConfig(tempfile.mkdtemp()))
registration.patch_worker(gpu_worker)
found = {{}}
for cls in (GPUARWorker, GPUGenerationWorker):
    registration.patch_worker_class(cls)
    for klass in cls.__mro__:
        for method in plugin.worker_plan():
            own = klass.__dict__.get(method.name)
            if own is not None and klass.__module__.startswith("vllm_omni"):
                found[f"{{klass.__qualname__}}.{{method.name}}"] = getattr(own, plugin.MARKER, False)
print(json.dumps(found))
"""


def test_every_override_of_the_real_omni_workers_is_wrapped() -> None:
    site = str(ROOT / "tests" / "engine" / "fixtures" / "omni_site")
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(site=site)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {
        "GPUARWorker.init_device": True,
        "GPUARWorker.load_model": True,
        "GPUARWorker.initialize_from_config": True,
        "GPUARWorker.determine_available_memory": True,
        "GPUARWorker.sleep": True,
        "GPUARWorker.wake_up": True,
        "OmniWorkerMixin.initialize_from_config": True,
        "OmniGPUWorkerBase.load_model": True,
        "OmniGPUWorkerBase.determine_available_memory": True,
        "OmniGPUWorkerBase.sleep": True,
        "OmniGPUWorkerBase.wake_up": True,
        "GPUGenerationWorker.init_device": True,
        "GPUGenerationWorker.compile_or_warm_up_model": True,
    }
