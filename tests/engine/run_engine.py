"""Run a real vLLM engine (CPU) on a tiny local model; the test drives it through stdin.

Prints ``GENERATED <tokens>`` after one generation, then waits: ``stop`` on stdin
shuts the engine down cleanly, end of input leaves it to be killed.
"""

from __future__ import annotations

import sys

if __name__ == "__main__":
    from vllm import LLM, SamplingParams

    model_dir, max_num_seqs = sys.argv[1], int(sys.argv[2])
    llm = LLM(
        model=model_dir,
        load_format="dummy",
        max_model_len=128,
        enforce_eager=True,
        dtype="float32",
        max_num_seqs=max_num_seqs,
        served_model_name="tiny-omni",
    )
    outputs = llm.generate(["the quick brown fox"] * 2, SamplingParams(max_tokens=8, ignore_eos=True))
    print("GENERATED", sum(len(o.outputs[0].token_ids) for o in outputs), flush=True)
    command = sys.stdin.readline().strip()
    if command == "stop":
        llm.llm_engine.engine_core.shutdown()
        del llm
        print("STOPPED", flush=True)
