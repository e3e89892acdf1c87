"""The vLLM general plugin: what runs inside every vLLM process, and what it does to each worker.

- ``plugin``: ``register()``, the ``vllm.general_plugins`` entry point, and the patching of
  worker classes, with its state kept per registration;
- ``lifecycle``: the steps run after model load, after KV-cache set-up, after warm-up, after
  an extensible KV cache's final commit and before shutdown;
- ``paged_kv``: the paged KV cache's bytes and blocks; ``extensible_kv``: vLLM 0.34's
  extensible KV cache, committed and reserved; ``memory_parts``: vLLM's figures of the weights,
  the activation peak and the CUDA graph pools;
- ``identity``: who a worker is (model, stage, replica, ranks, device) and its engine id;
  ``diffusion``: the same for vLLM-Omni's diffusion workers; ``facts``: what both publish about a worker;
- ``paged_kv``: the bytes and blocks of a worker's paged KV cache;
- ``imports``: running a callback on a module right after the process imports it.

The hook's settings are the engine side's (``engine.config``).
"""
