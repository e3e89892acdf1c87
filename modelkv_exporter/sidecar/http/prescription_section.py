"""The landing page's section on what to give vLLM: one engine's prescription (``sidecar.prescription``) in HTML."""

from __future__ import annotations

from collections.abc import Callable

from modelkv_exporter.contract.snapshot import Snapshot
from modelkv_exporter.sidecar.prescription import PRESCRIPTION_LEGEND, estimate_text, prescription, prescription_text


def prescription_section(snapshot: Snapshot, escape: Callable[[str], str]) -> str:
    """The engine's prescription: the flag to paste, how it was computed, and where vLLM's estimate was off; with
    no prescription, the reason."""
    found = prescription(snapshot)
    flag = f" <code>{escape(found.flag)}</code>" if found.flag is not None else ""
    estimate = estimate_text(found)
    off = f'<p class="muted">vLLM\'s start-up estimate: {escape(estimate)}</p>' if estimate else ""
    return (
        f'<p class="prescription"><strong>What to give vLLM:</strong>{flag} {escape(prescription_text(found))}</p>'
        f'{off}<p class="muted">{escape(PRESCRIPTION_LEGEND)}</p>'
    )
