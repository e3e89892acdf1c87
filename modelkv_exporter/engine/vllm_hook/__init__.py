"""The vLLM general plugin: what runs inside every vLLM process, and what it does to each worker.

- ``plugin``: ``register()``, the ``vllm.general_plugins`` entry point, and the patching of
  worker classes, with its state kept per registration;
- ``lifecycle``: the steps run after the device is up, after model load, after KV-cache set-up,
  after warm-up, after an extensible KV cache's final commit, after sleep and wake-up, and before shutdown;
- ``paged_kv``: the paged KV cache's bytes and blocks; ``extensible_kv``: vLLM 0.34's
  extensible KV cache, committed and reserved, and what vLLM keeps free for torch beside it;
  ``memory_parts``: the weights, the activation peak vLLM profiled and the CUDA graph pools as torch
  accounts them; ``sleep``: what vLLM's sleep allocator holds off the device, from its books;
- ``identity``: who a worker is (model, stage, replica, ranks, device) and its engine id;
  ``diffusion``: the same for vLLM-Omni's diffusion workers; ``facts``: what both publish about a worker;
- ``imports``: running a callback on a module right after the process imports it.

The hook's settings are the engine side's (``engine.config``).
"""
