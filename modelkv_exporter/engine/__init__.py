"""The engine side: declarations of a loaded model into the spool, from inside the engine process.

Builds on ``modelkv_exporter.contract`` and on torch (and vLLM for ``vllm_hook``); never on
the sidecar's libraries. Everything here logs under ``vllm.modelkv_exporter`` (``engine_log``).

- ``protocol``: the declaration protocol (``ModelLocalKVSpec``, ``collect_declarations``);
- ``module_walk``: the one walk over a model's module tree;
- ``resolve``: specs, ours or vLLM-Omni's, resolved at ``max_num_seqs`` into snapshot records;
- ``publish``: ``build_snapshot`` and the one-shot ``publish``;
- ``heartbeat``: ``SnapshotPublisher``, which keeps a live engine's snapshot current and ends it;
- ``ending``: why an engine ended, told from the exception that ended it;
- ``samplers``: measured memory (CUDA allocator, device, NVML, host RSS); ``weights``: the bytes of a
  model's weights as its tensors hold them;
- ``tensors``: the one tensor weigher (by storage, running no tensor subclass's code), used by weights,
  observation and discovery;
- ``observe``: what the declaring owners' ``transformers`` caches really hold;
- ``discover``: modules that hold caches they do not declare;
- ``plain_tensors``: plain tensors the census finds on a declaring owner, counted for that owner;
- ``config``: the engine side's settings, ``MODELKV_`` variables read into one typed object;
- ``vllm_hook``: the vLLM general plugin and what it does at each step of a worker's life.
"""
