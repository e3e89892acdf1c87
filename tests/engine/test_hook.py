"""The plugin's mechanics and the memory samplers, without starting an engine.

The CUDA and NVML samplers run their real code against stand-ins that follow the
``torch.cuda`` and ``pynvml`` interfaces, since neither a GPU nor NVML exists here.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from modelkv_exporter.engine import samplers as engine_memory
from modelkv_exporter.engine.config import HookConfig
from modelkv_exporter.engine.vllm_hook import plugin as vllm_plugin
from modelkv_exporter.engine.vllm_hook.identity import engine_id_for
from modelkv_testbed import ROOT


class FakeCuda:
    """``torch.cuda``'s memory statistics for one device, as the caching allocator keeps them.

    ``allocate``/``free`` move the live tensors; the peak follows them until it is reset. Every
    call is recorded in ``calls``.
    """

    def __init__(self, fail: set[str] | None = None) -> None:
        self.fail = fail or set()
        self.allocated = 100
        self.peak = 150
        self.calls: list[str] = []

    def _value(self, name: str, value: Any) -> Any:
        self.calls.append(name)
        if name in self.fail:
            raise RuntimeError(f"{name} unavailable")
        return value

    def allocate(self, size: int) -> None:
        self.allocated += size
        self.peak = max(self.peak, self.allocated)

    def free(self, size: int) -> None:
        self.allocated -= size

    def memory_allocated(self, device: Any) -> int:
        return self._value("memory_allocated", self.allocated)

    def memory_reserved(self, device: Any) -> int:
        return self._value("memory_reserved", 200)

    def max_memory_allocated(self, device: Any) -> int:
        return self._value("max_memory_allocated", self.peak)

    def reset_peak_memory_stats(self, device: Any) -> None:
        self._value("reset_peak_memory_stats", None)
        self.peak = self.allocated

    def mem_get_info(self, device: Any) -> tuple[int, int]:
        return self._value("mem_get_info", (700, 1000))


class FakeNvml:
    class NVMLError(Exception):
        pass

    def __init__(self, processes: list[Any] | None, fail: bool = False) -> None:
        self.processes = processes or []
        self.fail = fail
        self.asked: list[Any] = []

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        self.asked.append(uuid)
        return "handle"

    def nvmlDeviceGetHandleByIndex(self, index: int) -> str:
        self.asked.append(index)
        return "handle"

    def nvmlDeviceGetComputeRunningProcesses(self, handle: str) -> list[Any]:
        if self.fail:
            raise self.NVMLError("Not Supported (MIG)")
        return self.processes


def test_the_cuda_sampler_reads_allocator_device_and_own_nvml_process() -> None:
    import os

    nvml = FakeNvml([SimpleNamespace(pid=1, usedGpuMemory=5), SimpleNamespace(pid=os.getpid(), usedGpuMemory=321)])
    sample = engine_memory.CudaSampler(FakeCuda(), "cuda:0", nvml, "GPU-abc")()
    assert {k: v for k, v in sample.values.items() if k != "process_resident"} == {
        "torch_allocated": 100,
        "torch_reserved": 200,
        "torch_peak_allocated": 150,
        "torch_allocated_high_water": 150,
        "torch_allocated_low_water": 100,
        "device_used": 300,
        "device_total": 1000,
        "process_gpu": 321,
    }
    assert nvml.asked == ["GPU-abc"]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_peak_statistics_are_only_read_until_the_engine_initialised() -> None:
    """vLLM resets and reads torch's one peak while it loads and profiles; the sampler must leave it alone."""
    cuda = FakeCuda()
    sampler = engine_memory.CudaSampler(cuda, "cuda:0")
    for _ in range(5):
        cuda.allocate(1000)  # loading weights, the profile run's activations, the paged KV cache
        sampler()
    cuda.free(800)
    assert "reset_peak_memory_stats" not in cuda.calls
    baseline = sampler.initialised(profiled_activation_peak=None)
    assert cuda.calls[-1] == "reset_peak_memory_stats", "the first reset comes once initialisation is over"
    assert baseline.values["torch_allocated_high_water"] == 5100, "the peak seen while initialising"
    cuda.calls.clear()
    sampler()
    reads = [c for c in cuda.calls if c in ("max_memory_allocated", "reset_peak_memory_stats")]
    assert reads == ["max_memory_allocated", "reset_peak_memory_stats"], "each sample reads its window, then resets"


def profiled_activation_peak(cuda: FakeCuda, sample: Any) -> int:
    """vLLM's memory_profiling around a profile run, with a heartbeat sample in the middle of it."""
    cuda.reset_peak_memory_stats("cuda:0")
    before = cuda.memory_allocated("cuda:0")
    cuda.allocate(3000)  # the profile run's activations
    cuda.free(3000)
    sample()  # the heartbeat thread samples while the profile run goes on
    cuda.allocate(1000)
    cuda.free(1000)
    return cuda.max_memory_allocated("cuda:0") - before


@pytest.mark.parametrize("resetting", [False, True], ids=["as shipped", "broken: resets from the start"])
def test_the_sampler_never_shrinks_the_peak_vllm_profiles(resetting: bool) -> None:
    """The guard can fail: a sampler that resets peaks before initialisation makes vLLM plan for too little."""
    cuda = FakeCuda()
    sampler = engine_memory.CudaSampler(cuda, "cuda:0")
    sampler.resetting = resetting
    measured = profiled_activation_peak(cuda, sampler)
    assert (measured == 3000) is not resetting, f"vLLM would plan for {measured} bytes of activations"


@pytest.mark.parametrize("held", [True, False], ids=["held", "broken: not held"])
def test_a_profile_after_initialisation_reads_the_whole_peak_while_resets_are_held(held: bool) -> None:
    """vLLM's profile run again after initialisation (by an RPC) with a heartbeat sample inside it."""
    cuda = FakeCuda()
    sampler = engine_memory.CudaSampler(cuda, "cuda:0")
    sampler.initialised()
    release = sampler.hold_resets() if held else None
    measured = profiled_activation_peak(cuda, sampler)
    assert (measured == 3000) is held, f"vLLM would plan for {measured} bytes of activations"
    if release is not None:
        release()
        release()  # a second release changes nothing
    cuda.calls.clear()
    sampler()
    assert "reset_peak_memory_stats" in cuda.calls, "released: the sampler resets again"


class ProfilingWorker:
    """A worker whose ``determine_available_memory`` profiles as vLLM's does, with a heartbeat sample inside."""

    def __init__(self, cuda: FakeCuda, sampler: engine_memory.CudaSampler) -> None:
        self.cuda, self.sampler = cuda, sampler
        self.fail = False

    def determine_available_memory(self) -> int:
        measured = profiled_activation_peak(self.cuda, self.sampler)
        if self.fail:
            raise RuntimeError("out of memory while profiling")
        return measured


@pytest.mark.parametrize("hooked", [True, False], ids=["hooked", "broken: the plan lacks the step"])
def test_the_hook_holds_resets_around_a_profile_run_again_after_initialisation(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, hooked: bool
) -> None:
    from modelkv_exporter.engine.heartbeat import SnapshotPublisher
    from modelkv_exporter.engine.vllm_hook import lifecycle
    from modelkv_testbed.snapshots import make_snapshot

    if not hooked:
        plan = vllm_plugin.worker_plan
        monkeypatch.setattr(
            vllm_plugin, "worker_plan", lambda: tuple(m for m in plan() if m.name != "determine_available_memory")
        )
    module = SimpleNamespace(Worker=type("Worker", (ProfilingWorker,), {}))
    vllm_plugin.Registration(HookConfig(tmp_path)).patch_worker(module)  # type: ignore[arg-type]
    cuda = FakeCuda()
    sampler = engine_memory.CudaSampler(cuda, "cuda:0")
    worker = module.Worker(cuda, sampler)
    setattr(worker, lifecycle.ATTRIBUTE, lifecycle.WorkerHook(SnapshotPublisher(tmp_path, make_snapshot("e")), sampler))
    sampler.initialised()
    assert (worker.determine_available_memory() == 3000) is hooked
    assert sampler._holds == 0, "the hold ends with the profile"
    worker.fail = True
    with pytest.raises(RuntimeError, match="out of memory while profiling"):
        worker.determine_available_memory()
    assert sampler._holds == 0, "and when the profile raises, which reaches vLLM unchanged"


def test_the_high_water_mark_catches_an_allocation_that_lives_between_two_samples() -> None:
    cuda, clock = FakeCuda(), Clock()
    sampler = engine_memory.CudaSampler(cuda, "cuda:0", clock=clock)
    sampler.initialised()
    clock.now += 5
    assert sampler().values["torch_allocated_high_water"] == 100
    cuda.allocate(4000)  # a short-lived undeclared buffer, freed before the next sample
    cuda.free(4000)
    clock.now += 5
    sample = sampler()
    assert sample.values["torch_allocated"] == 100 and sample.values["torch_allocated_high_water"] == 4100
    clock.now += engine_memory.HIGH_WATER_SECONDS - 1
    assert sampler().values["torch_allocated_high_water"] == 4100, "seen by every scrape for two minutes"
    clock.now += 2
    later = sampler()
    assert later.values["torch_allocated_high_water"] == 100, "then forgotten"
    assert later.values["torch_peak_allocated"] == 4100, "the peak since start is kept across resets"


def test_the_baseline_high_water_mark_allows_the_profiled_activation_peak() -> None:
    cuda = FakeCuda()
    cuda.allocate(20_000)
    sampler = engine_memory.CudaSampler(cuda, "cuda:0")
    baseline = sampler.initialised(profiled_activation_peak=1_250)
    assert baseline.values["torch_allocated"] == 20_100
    assert baseline.values["torch_allocated_high_water"] == 21_350


def test_the_hook_hands_vllms_profiled_activation_peak_to_the_sampler_after_warm_up(tmp_path: Any) -> None:
    from modelkv_exporter.engine.heartbeat import SnapshotPublisher
    from modelkv_exporter.engine.vllm_hook import lifecycle
    from modelkv_testbed.snapshots import make_snapshot

    cuda = FakeCuda()
    sampler = engine_memory.CudaSampler(cuda, "cuda:0")
    publisher = SnapshotPublisher(tmp_path, make_snapshot("e"))
    worker = SimpleNamespace(peak_activation_memory=3000)
    setattr(worker, lifecycle.ATTRIBUTE, lifecycle.WorkerHook(publisher, sampler))
    config = HookConfig(tmp_path)
    lifecycle.after_kv_init(
        SimpleNamespace(
            **vars(worker),
            cache_config=SimpleNamespace(num_gpu_blocks=None),
            model_runner=SimpleNamespace(),
        ),
        config,
    )
    assert "reset_peak_memory_stats" not in cuda.calls, "the paged KV cache is allocated; warm-up is still to come"
    lifecycle.after_warm_up(worker, config)
    baseline = publisher.snapshot.measured.baseline
    assert baseline is not None and baseline.values["torch_allocated_high_water"] == 3100
    assert sampler.resetting and "reset_peak_memory_stats" in cuda.calls


@pytest.mark.parametrize(
    "nvml,nvml_device",
    [
        (None, None),
        (FakeNvml([SimpleNamespace(pid=1, usedGpuMemory=5)]), 0),
        (FakeNvml([], fail=True), 0),
        (FakeNvml([SimpleNamespace(pid=-1, usedGpuMemory=None)]), 0),
    ],
    ids=["no nvml", "pid not visible (container)", "nvml error (MIG)", "no usage reported"],
)
def test_what_nvml_cannot_tell_is_absent_never_zero(nvml: Any, nvml_device: Any) -> None:
    sample = engine_memory.CudaSampler(FakeCuda(), "cuda:0", nvml, nvml_device)()
    assert "process_gpu" not in sample.values
    assert sample.values["torch_allocated"] == 100


def test_a_failing_cuda_reading_drops_only_that_figure() -> None:
    sample = engine_memory.CudaSampler(FakeCuda({"mem_get_info", "memory_reserved"}), "cuda:0", None, None)()
    assert "device_used" not in sample.values and "device_total" not in sample.values
    assert "torch_reserved" not in sample.values and sample.values["torch_allocated"] == 100


def test_nvml_is_unavailable_here_and_says_so() -> None:
    assert engine_memory.load_nvml() is None
    sample = engine_memory.sampler_for(SimpleNamespace(type="cpu"))()
    assert set(sample.values) == {"process_resident"} and sample.values["process_resident"] > 0


@pytest.mark.parametrize(
    "visible,index,expected",
    [("", 1, 1), ("3,5", 1, 5), ("GPU-aa,GPU-bb", 0, "GPU-aa"), ("3", 2, None), ("", None, None)],
)
def test_physical_device_follows_cuda_visible_devices(
    monkeypatch: pytest.MonkeyPatch, visible: str, index: int | None, expected: object
) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert engine_memory.physical_device_id(SimpleNamespace(type="cuda", index=index)) == expected


def test_hook_config_from_environment() -> None:
    assert HookConfig.from_environ({}) is None
    assert HookConfig.from_environ({"MODELKV_SPOOL_DIR": "  "}) is None
    config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/s", "MODELKV_SAMPLE_INTERVAL": "0.1"})
    assert config is not None and config.sample_interval == 1.0
    config = HookConfig.from_environ(
        {"MODELKV_SPOOL_DIR": "/s", "MODELKV_SAMPLE_INTERVAL": "soon", "MODELKV_ENGINE_ID": "x"}
    )
    assert config is not None and config.sample_interval == 5.0 and config.engine_id == "x"
    assert config.observe, "observation is on by default"
    for value, observe in (("0", False), ("off", False), ("1", True), ("perhaps", True)):
        config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/s", "MODELKV_OBSERVE": value})
        assert config is not None and config.observe is observe, value


def test_engine_ids_are_stable_and_distinct_per_worker() -> None:
    base = {"served_model_name": "qwen3-omni", "stage_id": 1, "replica": "0", "tp_rank": 0, "pp_rank": 0, "dp_index": 0}
    assert engine_id_for(base, None) == "qwen3-omni-s1-r0-dp0-tp0-pp0"
    assert engine_id_for({**base, "tp_rank": 1}, None) != engine_id_for(base, None)
    assert engine_id_for({**base, "stage_id": 2}, None) != engine_id_for(base, None)
    assert engine_id_for(base, "pod-a").startswith("pod-a-s1")
    assert engine_id_for({}, None) == "engine"


class Worker:
    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def load_model(self, *args: Any, **kwargs: Any) -> str:
        self.calls.append(("load_model", args, kwargs))
        return "loaded"

    def initialize_from_config(self, kv_cache_config: Any) -> None:
        self.calls.append(("initialize_from_config", (kv_cache_config,), {}))

    def shutdown(self) -> None:
        self.calls.append(("shutdown", (), {}))


@pytest.mark.parametrize("round", [1, 2], ids=["first", "again in the same process"])
def test_wrappers_forward_everything_and_swallow_our_failures(caplog: pytest.LogCaptureFixture, round: int) -> None:
    module = SimpleNamespace(Worker=type("Worker", (Worker,), {}))
    config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/nonexistent"})
    assert config is not None
    registration = vllm_plugin.Registration(config)
    registration.patch_worker(module)  # type: ignore[arg-type]
    registration.patch_worker(module)  # type: ignore[arg-type]
    vllm_plugin.Registration(config).patch_worker(module)  # type: ignore[arg-type]
    worker = module.Worker()
    assert worker.load_model(load_dummy_weights=True) == "loaded"
    worker.load_model(1, 2)
    worker.initialize_from_config("kv")
    worker.shutdown()
    assert worker.calls == [
        ("load_model", (), {"load_dummy_weights": True}),
        ("load_model", (1, 2), {}),
        ("initialize_from_config", ("kv",), {}),
        ("shutdown", (), {}),
    ], "each original runs exactly once, even when patched twice"
    failures = [r for r in caplog.records if "failed; the engine continues" in r.getMessage()]
    assert len(failures) == 1, "a failing step is logged once, not on every call"


PROBE = """
import os, sys
import modelkv_exporter.engine.vllm_hook.plugin as plugin
from modelkv_exporter.engine.vllm_hook.imports import PatchOnImport
plugin.register(); plugin.register()
targets = (plugin.WORKER_MODULE, plugin.WRAPPER_MODULE, plugin.DIFFUSION_MODULE)
print("PROBE imported-early", any(name in sys.modules for name in targets))
finders = [f for f in sys.meta_path if isinstance(f, PatchOnImport)]
print("PROBE finders", len(finders), sorted(finders[0].waiting) == sorted(targets) if finders else None)
if os.environ.get("IMPORT_WORKER"):
    from vllm.v1.worker.gpu_worker import Worker
    from vllm.v1.worker.cpu_worker import CPUWorker
    from vllm.v1.worker.worker_base import WorkerWrapperBase
    print("PROBE wrapped", all(getattr(getattr(Worker, n), plugin.MARKER, False)
                         for n in ("load_model", "initialize_from_config", "compile_or_warm_up_model",
                                   "determine_available_memory", "shutdown")))
    print("PROBE cpu-inherits", getattr(CPUWorker.load_model, plugin.MARKER, False))
    print("PROBE init_worker-wrapped", getattr(WorkerWrapperBase.init_worker, plugin.MARKER, False))
    print("PROBE still-waiting-for", [sorted(f.waiting) for f in sys.meta_path if isinstance(f, PatchOnImport)])
    import inspect
    module = sys.modules[plugin.WORKER_MODULE]
    print("PROBE loader", type(module.__loader__).__name__, type(module.__spec__.loader).__name__,
          "class Worker" in inspect.getsource(module))
"""


def probe(**env: str) -> list[str]:
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("MODELKV_")}
    result = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT, env={**clean, **env}, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [line.removeprefix("PROBE ") for line in result.stdout.splitlines() if line.startswith("PROBE ")]


def test_inactive_without_a_spool_dir() -> None:
    assert probe() == ["imported-early False", "finders 0 None"]


@pytest.mark.slow
def test_register_is_cheap_and_patches_the_worker_only_when_imported() -> None:
    lines = probe(MODELKV_SPOOL_DIR="/tmp/x", IMPORT_WORKER="1")
    assert lines == [
        "imported-early False",
        "finders 1 True",
        "wrapped True",
        "cpu-inherits True",
        "init_worker-wrapped True",
        f"still-waiting-for [{sorted((vllm_plugin.WORKER_MODULE, vllm_plugin.WRAPPER_MODULE, vllm_plugin.DIFFUSION_MODULE))}]",
        "loader SourceFileLoader SourceFileLoader True",
    ]


ENVIRONMENT_PROBE = """
import faulthandler, gc, json, logging, os, signal, sys, threading, warnings

def state():
    loggers = {"": logging.root, **{n: l for n, l in logging.Logger.manager.loggerDict.items()
                                    if isinstance(l, logging.Logger)}}
    return {
        "environment": dict(os.environ),
        "loggers": {n: [l.level, [repr(h) for h in l.handlers], l.propagate, l.disabled] for n, l in loggers.items()},
        "logging": [logging.root.manager.disable, repr(logging.getLoggerClass()), repr(logging.getLogRecordFactory())],
        "threads": sorted(t.name for t in threading.enumerate()),
        "modules": sorted(sys.modules),
        "interpreter": [repr(sys.excepthook), repr(threading.excepthook), repr(sys.getprofile()), repr(sys.gettrace()),
                        sys.getrecursionlimit(), sys.getswitchinterval(), gc.isenabled(), len(gc.callbacks),
                        faulthandler.is_enabled(), repr(sys.path_hooks), repr(sys.path), len(warnings.filters),
                        [repr(signal.getsignal(s)) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)]],
        "meta_path": [type(f).__name__ for f in sys.meta_path],
    }

before = state()
import modelkv_exporter.engine.vllm_hook.plugin as plugin
if os.environ.get("BREAK"):
    shipped = plugin.register
    def register():
        shipped()
        os.environ["SOMETHING"] = "1"
        logging.getLogger("vllm").setLevel(logging.DEBUG)
        threading.Thread(target=threading.Event().wait, name="ours", daemon=True).start()
        import numpy
    plugin.register = register
plugin.register()
print(json.dumps({"before": before, "after": state()}))
"""


def environment_change(**env: str) -> dict[str, object]:
    """What importing the plugin and ``register()`` (hook on) changed in a fresh interpreter, by kind."""
    import json
    import os

    clean = {k: v for k, v in os.environ.items() if not k.startswith("MODELKV_")}
    run = subprocess.run(
        [sys.executable, "-c", ENVIRONMENT_PROBE],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**clean, "MODELKV_SPOOL_DIR": "/tmp/modelkv-probe-spool", **env},
        timeout=120,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    states = json.loads(run.stdout)
    before, after = states["before"], states["after"]
    loggers = {n: v for n, v in after["loggers"].items() if before["loggers"].get(n) != v}
    new_modules = sorted(set(after["modules"]) - set(before["modules"]))
    return {
        "environment": {k: v for k, v in after["environment"].items() if before["environment"].get(k) != v},
        "loggers changed": {n: v for n, v in loggers.items() if n in before["loggers"]},
        "loggers added": {n: v for n, v in loggers.items() if n not in before["loggers"]},
        "logging": after["logging"] != before["logging"],
        "threads": sorted(set(after["threads"]) - set(before["threads"])),
        "imports": [
            m for m in new_modules if m.partition(".")[0] not in sys.stdlib_module_names | {"modelkv_exporter"}
        ],
        "interpreter": after["interpreter"] != before["interpreter"],
        "meta_path": [f for f in after["meta_path"] if f not in before["meta_path"]],
    }


@pytest.mark.parametrize("broken", [False, True], ids=["as shipped", "broken: a variable, a level, a thread, numpy"])
def test_register_adds_nothing_to_the_engines_environment(broken: bool) -> None:
    """No variable, no logging configuration, no thread, no library beyond the standard one; only the import hook."""
    change = environment_change(**({"BREAK": "1"} if broken else {}))
    added: dict[str, object] = change.pop("loggers added")  # type: ignore[assignment]
    change["loggers added"] = {
        name: state
        for name, state in added.items()
        if not name.startswith("vllm.modelkv_exporter.") or state != [0, [], True, False]
    }  # ours: no level, no handler of its own, propagating to vLLM's
    unchanged = {
        "environment": {},
        "loggers changed": {},
        "loggers added": {},
        "logging": False,
        "threads": [],
        "imports": [],
        "interpreter": False,
        "meta_path": ["PatchOnImport"],
    }
    if not broken:
        assert change == unchanged
    else:
        assert change["environment"] == {"SOMETHING": "1"} and change["loggers added"] == {
            "vllm": [10, [], True, False]
        }
        assert change["threads"] == ["ours"] and "numpy" in change["imports"]  # type: ignore[operator]


def test_an_unexpected_vllm_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/s"})
    assert config is not None
    registration = vllm_plugin.Registration(config)
    registration.patch_worker(SimpleNamespace())  # type: ignore[arg-type]
    assert "cannot hook vLLM's Worker" in caplog.text
    module = SimpleNamespace(Worker=type("Worker", (), {"load_model": lambda self: "ok"}))
    registration.patch_worker(module)  # type: ignore[arg-type]
    assert module.Worker().load_model() == "ok", "a Worker with fewer methods is hooked where it can be"
    assert getattr(module.Worker.load_model, vllm_plugin.MARKER)


def test_subclass_overrides_without_super_still_reach_the_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    from modelkv_exporter.engine.vllm_hook import lifecycle as engine_hook

    seen: list[str] = []
    for step in ("after_load_model", "after_kv_init", "after_warm_up", "before_shutdown"):

        def record(worker: Any, config: Any, *arguments: Any, step: str = step) -> None:
            seen.append(step)

        record.__name__ = step
        monkeypatch.setattr(engine_hook, step, record)

    class Base(Worker):
        def compile_or_warm_up_model(self) -> None:
            self.calls.append(("warm", (), {}))

    class CPUWorkerLike(Base):
        def compile_or_warm_up_model(self) -> None:  # like vLLM's CPUWorker: no super()
            self.calls.append(("cpu-warm", (), {}))

    module = SimpleNamespace(Worker=Base)
    config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/s"})
    assert config is not None
    vllm_plugin.Registration(config).patch_worker(module)  # type: ignore[arg-type]
    worker = CPUWorkerLike()
    worker.load_model()
    worker.initialize_from_config("kv")
    worker.compile_or_warm_up_model()
    worker.shutdown()
    assert seen == ["after_load_model", "after_kv_init", "after_warm_up", "before_shutdown"]
    assert [c[0] for c in worker.calls] == ["load_model", "initialize_from_config", "cpu-warm", "shutdown"]


def recording_steps(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from modelkv_exporter.engine.vllm_hook import lifecycle

    seen: list[str] = []
    for step in ("after_load_model", "after_kv_init", "after_warm_up", "before_shutdown"):

        def record(worker: Any, config: Any, /, *args: Any, step: str = step, **kwargs: Any) -> None:
            seen.append(f"{step}{list(args) if args else ''}{kwargs if kwargs else ''}")

        record.__name__ = step
        monkeypatch.setattr(lifecycle, step, record)
    return seen


def test_an_override_that_calls_super_runs_each_step_once(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = recording_steps(monkeypatch)

    base = type("Worker", (Worker,), {})

    class Subclass(base):  # type: ignore[valid-type,misc]
        def load_model(self, *args: Any, **kwargs: Any) -> str:
            return super().load_model(*args, **kwargs)

        def shutdown(self) -> None:
            super().shutdown()

    config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/s"})
    assert config is not None
    registration = vllm_plugin.Registration(config)
    registration.patch_worker(SimpleNamespace(Worker=base))  # type: ignore[arg-type]
    registration.patch_worker_class(Subclass)
    worker = Subclass()
    worker.load_model()
    worker.initialize_from_config(kv_cache_config="kv")
    worker.shutdown()
    assert seen == ["after_load_model", "after_kv_init{'kv_cache_config': 'kv'}", "before_shutdown"]
    assert [c[0] for c in worker.calls] == ["load_model", "initialize_from_config", "shutdown"]


class KeywordWorker:
    """A worker whose KV initialisation takes keywords beside the config, in any order."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def initialize_from_config(self, kv_cache_config: Any, *, first: Any = None, second: Any = None) -> None:
        self.calls.append(((kv_cache_config,), {"first": first, "second": second}))


def test_steps_get_the_arguments_as_the_caller_gave_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positional stays positional, a keyword stays a keyword under its name, in the order given."""
    given: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    from modelkv_exporter.engine.vllm_hook import lifecycle

    def after_kv_init(worker: Any, config: Any, /, *args: Any, **kwargs: Any) -> None:
        given.append((args, kwargs))

    monkeypatch.setattr(lifecycle, "after_kv_init", after_kv_init)
    base = type("Worker", (KeywordWorker,), {})
    config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/s"})
    assert config is not None
    vllm_plugin.Registration(config).patch_worker(SimpleNamespace(Worker=base))  # type: ignore[arg-type]
    worker = base()
    worker.initialize_from_config("kv")
    worker.initialize_from_config(kv_cache_config="kv")
    worker.initialize_from_config(second=2, kv_cache_config="kv", first=1)
    worker.initialize_from_config("kv", second=2)
    assert given == [
        (("kv",), {}),
        ((), {"kv_cache_config": "kv"}),
        ((), {"second": 2, "kv_cache_config": "kv", "first": 1}),
        (("kv",), {"second": 2}),
    ]
    assert [list(kwargs) for _, kwargs in given] == [
        [],
        ["kv_cache_config"],
        ["second", "kv_cache_config", "first"],
        ["second"],
    ]
    assert worker.calls[2] == (("kv",), {"first": 1, "second": 2}), "the original gets them unchanged"


class KVCacheTensor:
    def __init__(self, size: int) -> None:
        self.size = size


@pytest.mark.parametrize("by_keyword", [False, True], ids=["by position", "by keyword"])
def test_the_kv_step_finds_the_config_however_it_is_passed(tmp_path: Any, by_keyword: bool) -> None:
    """The real step: the paged KV cache of the ``KVCacheConfig`` handed to ``initialize_from_config``."""
    from modelkv_exporter.engine.heartbeat import SnapshotPublisher
    from modelkv_exporter.engine.vllm_hook import lifecycle
    from modelkv_testbed.snapshots import make_snapshot

    base = type("Worker", (KeywordWorker,), {})
    vllm_plugin.Registration(HookConfig(tmp_path)).patch_worker(SimpleNamespace(Worker=base))  # type: ignore[arg-type]
    worker = base()
    publisher = SnapshotPublisher(tmp_path, make_snapshot("e"))
    sampler = engine_memory.CudaSampler(FakeCuda(), "cuda:0")
    setattr(worker, lifecycle.ATTRIBUTE, lifecycle.WorkerHook(publisher, sampler))
    kv = SimpleNamespace(kv_cache_tensors=[KVCacheTensor(4096), KVCacheTensor(4096)], num_blocks=16)
    decoy = SimpleNamespace(kv_cache_tensors=[KVCacheTensor(1)], num_blocks=1)
    if by_keyword:
        worker.initialize_from_config(first=decoy, kv_cache_config=kv)
    else:
        worker.initialize_from_config(kv, first=decoy)
    settings = publisher.snapshot.settings
    assert (settings.paged_kv_bytes, settings.paged_kv_blocks) == (8192, 16)


def diffusion_worker_like() -> type:
    """A fresh class like vLLM-Omni's DiffusionWorker: the constructor itself loads the model."""

    class DiffusionWorker:
        def __init__(self, rank: int) -> None:
            self.rank = rank
            self.calls: list[str] = []
            self.load_model()

        def load_model(self, load_format: str = "default") -> None:
            self.calls.append("load_model")

        def set_kv_cache_configs(self, kv_cache_configs: list[Any], resolved_max_model_len: int) -> None:
            self.calls.append("set_kv_cache_configs")

        def shutdown(self) -> None:
            self.calls.append("shutdown")

    return DiffusionWorker


def test_a_diffusion_worker_subclass_is_hooked_before_its_constructor_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = recording_steps(monkeypatch)

    base = diffusion_worker_like()

    class PlatformDiffusionWorker(base):  # type: ignore[valid-type,misc]
        def load_model(self, load_format: str = "default") -> None:  # no super(): a platform's own loading
            self.calls.append("platform load_model")

    module = SimpleNamespace(DiffusionWorker=base)
    config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/s"})
    assert config is not None
    vllm_plugin.Registration(config).patch_diffusion_worker(module)  # type: ignore[arg-type]
    worker = PlatformDiffusionWorker(0)
    worker.set_kv_cache_configs(["kv"], 128)
    worker.shutdown()
    assert worker.calls == ["platform load_model", "set_kv_cache_configs", "shutdown"]
    assert seen == ["after_load_model", "after_kv_init[['kv'], 128]", "before_shutdown"]


def test_without_the_constructor_wrapper_a_platform_override_is_missed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same as above with the ``__init__`` wrapper taken away: the override's load goes unseen."""
    seen = recording_steps(monkeypatch)
    base = diffusion_worker_like()

    class PlatformDiffusionWorker(base):  # type: ignore[valid-type,misc]
        def load_model(self, load_format: str = "default") -> None:
            self.calls.append("platform load_model")

    config = HookConfig.from_environ({"MODELKV_SPOOL_DIR": "/s"})
    assert config is not None
    vllm_plugin.Registration(config).patch_diffusion_worker(SimpleNamespace(DiffusionWorker=base))  # type: ignore[arg-type]
    base.__init__ = base.__init__.__wrapped__
    assert PlatformDiffusionWorker(0).calls == ["platform load_model"]
    assert seen == []


def test_the_installed_vllm_s_sleep_allocator_keeps_the_books_the_hook_reads() -> None:
    """vLLM 0.30 and 0.32 (this environment's): the allocator's records carry what ``sleep.released_bytes`` reads,
    and none exists until vLLM makes one (the hook never makes it)."""
    import dataclasses

    from vllm.device_allocator import AllocationData
    from vllm.device_allocator.cumem import CuMemAllocator

    from modelkv_exporter.engine.vllm_hook import sleep

    assert {"handle", "tag", "is_asleep"} <= {f.name for f in dataclasses.fields(AllocationData)}
    assert CuMemAllocator.instance is None and sleep.sleep_allocator() is None
    books = SimpleNamespace(
        pointer_to_data={
            1: AllocationData(handle=(0, 300, 0, 0), tag="weights", is_asleep=True),
            2: AllocationData(handle=(0, 50, 0, 0), tag="kv_cache", is_asleep=False),
            3: AllocationData(handle=(0, 7, 0, 0), tag="Odd Tag", is_asleep=True),
        }
    )
    assert sleep.released_bytes(books) == {"weights": 300, "other": 7}
    assert sleep.released_bytes(SimpleNamespace(pointer_to_data={1: SimpleNamespace(is_asleep=True)})) is None
    assert sleep.released_bytes(None) == {}
