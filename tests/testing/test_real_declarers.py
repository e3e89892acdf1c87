"""The model author's check on the real vLLM-Omni declarers, run on CPU the way vLLM-Omni drives them.

The verdicts match docs/observed-caches.md: the Qwen3-TTS tokenizer decoder under-reports its
eager path by 2.18x in ICL mode, over-reports it in x-vector mode and declares nothing without
its graph wrapper; the Ming talker and MiMo-Audio's local transformer hold what they declare.
The suggestion for the decoder, declared instead, holds what it declares; and each kind of wrong
declaration is caught by the field it gets wrong.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from modelkv_exporter.contract.vocabulary import RowDriver
from modelkv_exporter.engine.protocol import ModelLocalKVScope
from modelkv_exporter.testing import Report, VerdictKind, check
from tests.engine.test_vllm_omni_declarers import (
    MING_ROW,
    POSITION,
    WINDOW,
    running_decoder,
    running_mimo_local_transformer,
    running_ming_talker,
)

MIMO_ROW = 2 * 16 * 64 * 16 * 11 * 2


def stream(decoder: Any, rows: int, icl: bool = True, steps: int = 6) -> None:
    """``rows`` requests through ``batched_chunked_decode``, one call a step, as Qwen3TTSCode2Wav does."""
    prefix = WINDOW if icl else 0
    states = [{"prefix_frames": prefix} for _ in range(rows)]
    for step in range(steps):
        new = prefix + 1 if step == 0 else 25
        codes = torch.randint(0, 64, (rows, 4, new))
        with torch.no_grad():
            decoder.batched_chunked_decode(
                codes, [new] * rows, caches=states, chunk_size=300, left_context_size=25, max_batch_size=0
            )


def icl(decoder: Any, rows: int) -> None:
    stream(decoder, rows, icl=True)


def xvec(decoder: Any, rows: int) -> None:
    stream(decoder, rows, icl=False)


def local_decode(llm: Any, rows: int) -> None:
    with torch.no_grad():
        llm.local_forward(torch.randn(rows, 1, 1024, dtype=torch.bfloat16), tokens_device=torch.device("cpu"))


def talk(talker: Any, rows: int) -> None:
    """One talker request (it runs one at a time, whatever the batch)."""
    with torch.no_grad():
        talker.forward(
            input_ids=torch.zeros(1, dtype=torch.long),
            positions=torch.zeros(1, dtype=torch.long),
            inputs_embeds=torch.randn(1, 12, 896, dtype=torch.bfloat16),
            runtime_additional_information=[{"max_steps": 3}],
        )


def field_of_each_problem(report: Report, owner: str = "") -> list[str]:
    return [problem.field for problem in report.owner(owner).problems]


@pytest.fixture(scope="module")
def icl_report() -> Report:
    """The decoder at max_num_seqs 2, streamed at one request and then two, in ICL mode."""
    return check(running_decoder(2, wrapper=True), icl, max_num_seqs=2, batches=(1, 2))


def test_qwen3_tts_decoder_in_icl_mode_under_reports_by_2_18(icl_report: Report) -> None:
    owner = icl_report.owner("")
    assert owner.verdict.kind is VerdictKind.UNDER_REPORTS
    assert owner.declared_bytes == 142 * POSITION * 2 and owner.observed_bytes == 310 * POSITION * 2
    assert f"{owner.verdict.factor:.2f}" == "2.18"
    one_row = [peak.bytes for peak in owner.peaks if peak.batch == 1]
    assert max(one_row) == 310 * POSITION == 20_316_160, "ICL at one row, as docs/observed-caches.md has it"
    assert field_of_each_problem(icl_report) == ["physical_capacity_positions"]
    assert "declares 142 positions a row" in owner.problems[0].text and "held 310 a row" in owner.problems[0].text
    with pytest.raises(AssertionError, match="under-reports by 2.18x"):
        icl_report.assert_ok()


def test_qwen3_tts_decoder_in_xvec_mode_over_reports_at_its_bound() -> None:
    """Two rows at max_num_seqs 2, its window filled: the run reached the bound, so holding less is over-reporting."""
    decoder = running_decoder(2, wrapper=True)
    report = check(decoder, xvec, max_num_seqs=2, batches=(2,))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.OVER_REPORTS
    assert owner.observed_bytes == 97 * POSITION * 2 and owner.declared_bytes == 142 * POSITION * 2
    assert f"{owner.observed_bytes / owner.declared_bytes:.2f}" == "0.68"
    assert not report.ok


def test_qwen3_tts_decoder_without_its_graph_wrapper_declares_nothing_but_holds_it() -> None:
    decoder = running_decoder(1, wrapper=False)
    report = check(decoder, icl, max_num_seqs=1, batches=(1,))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.UNDECLARED and owner.observed_bytes == 310 * POSITION
    assert "declares nothing but held 20,316,160 B" in str(report)


def test_the_suggestion_for_the_qwen3_tts_decoder_declared_instead_holds_what_it_declares(
    icl_report: Report, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batch sizes show one row per sequence; the positions a row are the 310 the eager path holds."""
    (suggestion,) = icl_report.owner("").suggestions
    assert suggestion.missing == ("scope",), suggestion.code
    assert "physical_capacity_positions=310," in suggestion.code and "rows=RowDriver.MAX_NUM_SEQS," in suggestion.code
    assert "# scope: not inferred" in suggestion.code and "scope=" not in suggestion.code
    spec = suggestion.spec(scope=ModelLocalKVScope.INVOCATION)
    assert (spec.layers, spec.kv_heads, spec.head_dim, spec.dtype) == (8, 16, 64, torch.float32)
    decoder = running_decoder(2, wrapper=True)
    monkeypatch.setattr(decoder, "model_local_kv_specs", lambda: [spec], raising=False)
    again = check(decoder, icl, max_num_seqs=2, batches=(2,))
    assert again.owner("").verdict.kind is VerdictKind.HOLDS
    again.assert_ok()


def test_the_pasted_suggestion_is_the_same_declaration(icl_report: Report) -> None:
    """The printed code, with its one open figure written in, builds the spec ``Suggestion.spec`` builds; pasted
    as it is, it does not build (a missing argument fails where the model declares, not in production)."""
    from modelkv_exporter.protocol import ModelLocalKVSpec

    (suggestion,) = icl_report.owner("").suggestions
    names = {"torch": torch, "ModelLocalKVScope": ModelLocalKVScope, "RowDriver": RowDriver}
    names["ModelLocalKVSpec"] = ModelLocalKVSpec
    with pytest.raises(TypeError, match="scope"):
        eval(suggestion.code, names)
    pasted = "\n".join(
        "    scope=ModelLocalKVScope.INVOCATION," if line.strip().startswith("# scope:") else line
        for line in suggestion.code.splitlines()
    )
    built = eval(pasted, names)
    assert built == suggestion.spec(scope=ModelLocalKVScope.INVOCATION)


def test_ming_talker_holds_what_it_declares() -> None:
    talker = running_ming_talker()
    report = check(talker, talk, max_num_seqs=4, batches=(1, 4))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.HOLDS and owner.observed_bytes == owner.declared_bytes == MING_ROW
    report.assert_ok()


def test_mimo_audio_local_transformer_holds_what_it_declares() -> None:
    llm = running_mimo_local_transformer()
    report = check(llm, local_decode, max_num_seqs=2, batches=(1, 2))
    owner = report.owner("")
    assert owner.verdict.kind is VerdictKind.HOLDS and owner.observed_bytes == 2 * MIMO_ROW
    report.assert_ok()


def with_spec(owner: Any, monkeypatch: pytest.MonkeyPatch, **changes: Any) -> None:
    """Declare the owner's one spec with ``changes``."""
    (spec,) = owner.model_local_kv_specs()
    monkeypatch.setattr(owner, "model_local_kv_specs", lambda: [replace(spec, **changes)], raising=False)


def test_too_few_layers_is_caught_by_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    talker = running_ming_talker()
    with_spec(talker, monkeypatch, layers=23)
    report = check(talker, talk, max_num_seqs=1, batches=(1, 2))
    assert field_of_each_problem(report) == ["layers"]
    assert report.owner("").verdict.kind is VerdictKind.UNDER_REPORTS
    with pytest.raises(AssertionError, match=r"wrong field layers: .* declares 23; its caches have 24 layers"):
        report.assert_ok()


def test_a_wrong_dtype_of_the_same_width_is_caught_by_dtype(monkeypatch: pytest.MonkeyPatch) -> None:
    """float16 for bfloat16: the bytes add up, only the geometry tells."""
    talker = running_ming_talker()
    with_spec(talker, monkeypatch, dtype=torch.float16)
    report = check(talker, talk, max_num_seqs=1, batches=(1, 2))
    assert report.owner("").verdict.kind is VerdictKind.HOLDS
    assert field_of_each_problem(report) == ["dtype"]
    with pytest.raises(AssertionError, match=r"wrong field dtype: .* declares float16; its caches hold bfloat16"):
        report.assert_ok()


def test_fixed_rows_where_they_follow_max_num_seqs_is_caught_by_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    llm = running_mimo_local_transformer()
    with_spec(llm, monkeypatch, rows=RowDriver.FIXED, rows_fixed=1, rows_reason="one local decode at a time")
    report = check(llm, local_decode, max_num_seqs=2, batches=(1, 2))
    assert field_of_each_problem(report) == ["rows"]
    with pytest.raises(
        AssertionError, match=r"wrong field rows: .* declares FIXED \(1 rows\); its caches held one row"
    ):
        report.assert_ok()


def test_a_capacity_one_short_is_caught_by_physical_capacity_positions(monkeypatch: pytest.MonkeyPatch) -> None:
    talker = running_ming_talker()
    with_spec(talker, monkeypatch, physical_capacity_positions=2047)
    report = check(talker, talk, max_num_seqs=1, batches=(1, 2))
    assert field_of_each_problem(report) == ["physical_capacity_positions"]
    assert report.owner("").verdict.kind is VerdictKind.UNDER_REPORTS
    with pytest.raises(AssertionError, match=r"declares 2047 positions a row .* held 2048 a row"):
        report.assert_ok()
