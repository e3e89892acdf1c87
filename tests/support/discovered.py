"""Snapshots with discovered owners, built by the contract's own dataclasses (written with ``Snapshot.to_json``)."""

from __future__ import annotations

import json
from dataclasses import replace

from modelkv_exporter.contract import arithmetic
from modelkv_exporter.contract.snapshot import DiscoveredOwner, DiscoveryStatus, KVLayout, Snapshot
from modelkv_exporter.contract.vocabulary import DiscoveryMethod
from modelkv_testbed.snapshots import make_snapshot

CENSUS = DiscoveryMethod.CENSUS.value
CACHE_LAYER = DiscoveryMethod.CACHE_LAYER.value


def kv_layout(
    layers: int = 8, kv_heads: int = 16, head_dim: int = 64, positions: int = 72, rows: int = 4, element_size: int = 4
) -> KVLayout:
    """A key/value layout as the engine saw it."""
    return KVLayout(
        layers, kv_heads, head_dim, {2: "bfloat16", 4: "float32"}[element_size], element_size, positions, rows
    )


def layout_bytes(layout: KVLayout) -> int:
    """What keys and values of ``layout`` hold: the declared arithmetic at the layout's positions and rows."""
    per_row = arithmetic.bytes_per_row(
        layers=layout.layers,
        kv_heads=layout.kv_heads,
        head_dim=layout.head_dim,
        positions=layout.positions,
        element_size=layout.element_size,
    )
    return per_row * layout.rows


def make_discovered(
    owner: str = "tokenizer.decoder",
    *,
    found_by: str = CACHE_LAYER,
    layout: KVLayout | None = None,
    peak_bytes: int | None = None,
    recent_peak_bytes: int | None = None,
    live_bytes: int | None = None,
    declares: bool = False,
    owner_class: str = "Qwen3TTSTokenizerV2Decoder",
    storages: int = 16,
) -> DiscoveredOwner:
    """A discovered owner; its peak is its layout's bytes unless given."""
    peak = peak_bytes if peak_bytes is not None else (layout_bytes(layout) if layout is not None else 1 << 20)
    return DiscoveredOwner(
        owner=owner,
        owner_class=owner_class,
        found_by=found_by,
        peak_bytes=peak,
        recent_peak_bytes=peak if recent_peak_bytes is None else recent_peak_bytes,
        live_bytes=peak if live_bytes is None else live_bytes,
        declares=declares,
        storages=storages,
        layout=layout,
    )


def discovery_status(
    *,
    enabled: bool = True,
    reason: str | None = None,
    census_at: float | None = 1_799_999_990.0,
    census_seconds: float | None = 0.0125,
    budget_exhausted: str | None = None,
    below_floor: int = 0,
    over_budget: int = 0,
) -> DiscoveryStatus:
    """A discovery status: running, with one census taken, unless told otherwise."""
    return DiscoveryStatus(
        enabled=enabled,
        reason=reason,
        census_at=census_at if enabled else None,
        census_seconds=census_seconds if enabled else None,
        modules=120 if enabled else 0,
        objects=3400 if enabled else 0,
        budget_exhausted=budget_exhausted,
        owners_below_floor=below_floor,
        owners_over_budget=over_budget,
    )


def with_discovery(
    snapshot: Snapshot, discovered: tuple[DiscoveredOwner, ...], status: DiscoveryStatus | None
) -> Snapshot:
    """``snapshot`` as a writer with discovery publishes it."""
    return replace(snapshot, discovered=discovered, discovery=status)


def discovering_snapshot(engine_id: str = "qwen3-tts-eager", **kwargs: object) -> Snapshot:
    """A Qwen3-TTS code2wav engine whose tokenizer decoder declares nothing on its eager path, and a streaming
    audio encoder whose own paged cache the census found."""
    snapshot = make_snapshot(engine_id, stage_name="code2wav", **kwargs)  # type: ignore[arg-type]
    found = (
        make_discovered("tokenizer.decoder", layout=kv_layout()),
        make_discovered(
            "audio_encoder.streaming_cache",
            found_by=CENSUS,
            layout=kv_layout(layers=24, kv_heads=1, head_dim=1024, positions=500, rows=1, element_size=2),
            owner_class="StreamingAudioKVCache",
            recent_peak_bytes=0,
            live_bytes=0,
            storages=1,
        ),
        make_discovered("decoder", found_by=CENSUS, owner_class="Owner", declares=True, peak_bytes=3 << 20),
    )
    return with_discovery(snapshot, found, discovery_status(below_floor=3))


GOLDEN_NOW = 1_800_000_000.0
BREAKDOWN_SETTINGS = ("weights_bytes", "activation_peak_bytes", "cuda_graph_bytes")
"""The settings the memory breakdown added: an older writer has none of them."""
"""The golden spools' clock (``tests/sidecar/test_golden.py``)."""
HOSTILE_OWNER = "blocks.0\n.attn\u202e\t" + "deeply_nested_submodule." * 12 + "cache"
"""A module path with a newline, a bidi override, a tab and 300-odd characters: every rule of ``label`` applies."""


def golden_discovered_spool() -> dict[str, bytes]:
    """The golden spool ``discovered``: file name to bytes, every document written by ``Snapshot.to_dict``.

    One engine runs discovery (a cache-layer owner, a census owner, an owner that declares too, a hostile
    path, a census that ran out of its object budget); one has discovery off; one is from a writer that
    predates discovery, whose document lacks both fields.
    """
    now = GOLDEN_NOW - 1
    running = discovering_snapshot("qwen3-tts-eager", heartbeat_at=now, interval=5.0)
    running = with_discovery(
        running,
        (*running.discovered, make_discovered(HOSTILE_OWNER, found_by=CENSUS, owner_class="Ring\x00Buffer")),
        discovery_status(below_floor=3, over_budget=1, budget_exhausted="objects"),
    )
    off = with_discovery(
        make_snapshot("minicpmo-audio", heartbeat_at=now, interval=5.0, stage_name="thinker"),
        (),
        discovery_status(enabled=False, reason="turned off by MODELKV_OBSERVE=0"),
    )
    older = make_snapshot("older-writer", heartbeat_at=now, interval=5.0).to_dict()
    del older["discovered"], older["discovery"]
    for field in ("paged_kv_reserved_bytes", "paged_kv_reserved_blocks", *BREAKDOWN_SETTINGS):
        del older["settings"][field]
    documents = {"qwen3-tts-eager": running.to_dict(), "minicpmo-audio": off.to_dict(), "older-writer": older}
    return {f"{name}.json": (json.dumps(doc, indent=1) + "\n").encode() for name, doc in documents.items()}
