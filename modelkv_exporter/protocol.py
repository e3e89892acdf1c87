"""The declaration protocol for model authors: ``ModelLocalKVSpec``, its scope and row driver, the collector.

A stable import path: the implementation lives in ``modelkv_exporter.engine.protocol``.
Declare a cache by implementing ``model_local_kv_specs()`` on the module that owns it::

    from modelkv_exporter.protocol import ModelLocalKVScope, ModelLocalKVSpec, RowDriver
"""

from modelkv_exporter.engine.protocol import (
    Collected,
    DeclarerFailure,
    HasModelLocalKV,
    ModelLocalKVScope,
    ModelLocalKVSpec,
    OwnedSpec,
    RowDriver,
    collect_declarations,
    collect_model_local_kv_specs,
    driver_value,
    element_size,
    near_misses,
    spec_from_hf_config,
)

__all__ = [
    "Collected",
    "DeclarerFailure",
    "HasModelLocalKV",
    "ModelLocalKVScope",
    "ModelLocalKVSpec",
    "RowDriver",
    "OwnedSpec",
    "collect_declarations",
    "collect_model_local_kv_specs",
    "driver_value",
    "element_size",
    "near_misses",
    "spec_from_hf_config",
]
