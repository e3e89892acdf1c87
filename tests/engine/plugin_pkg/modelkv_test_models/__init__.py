"""Test-only vLLM plugin: registers an out-of-tree architecture whose inner module declares its KV."""

ARCHITECTURE = "ModelKVTestForCausalLM"


def register() -> None:
    """Entry point of ``vllm.general_plugins``."""
    from vllm import ModelRegistry

    if ARCHITECTURE not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(ARCHITECTURE, "modelkv_test_models.model:ModelKVTestForCausalLM")
