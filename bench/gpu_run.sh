#!/usr/bin/env bash
# The whole device run of bench/gpu_truth.py, for a GPU machine that has torch, transformers and
# nvidia-ml-py but not the sidecar's packages: those travel as wheels in .whl (see gpu_truth.py).
# Runs the check twice: as the machine starts it, then in a new PID namespace, where the process's
# PID is not its host PID: NVML's figure must still be the process's own (the driver maps PIDs
# into the caller's namespace), and the case that asks for a PID NVML does not list is absent, not 0.
# Writes what it prints under $OUT (or ./gpu-run when OUT is unset).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-run}"
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:.
fi
export PYTHONUNBUFFERED=1
{
    nvidia-smi
    nvidia-smi --query-gpu=name,uuid,driver_version,memory.total,mig.mode.current --format=csv
    python3 -c 'import torch, transformers, pynvml, fastapi, uvicorn; print("torch", torch.__version__, "transformers", transformers.__version__, "fastapi", fastapi.__version__, "uvicorn", uvicorn.__version__)'
    uname -a
} >"$out/environment.txt" 2>&1
status=0
python3 bench/gpu_truth.py --expect-nvml present 2>&1 | tee "$out/pid-visible.txt" || status=1
if unshare --pid --fork --mount-proc true 2>/dev/null; then
    unshare --pid --fork --mount-proc python3 bench/gpu_truth.py --expect-nvml present 2>&1 | tee "$out/pid-namespace.txt" || status=1
else
    echo "unshare --pid is refused here: the PID-namespace run did not happen" | tee "$out/pid-namespace.txt"
    status=1
fi
exit "$status"
