"""The declaration protocol: ours must behave exactly like vLLM-Omni's, and accept its objects."""

from __future__ import annotations

import importlib
import logging
import random
from types import ModuleType, SimpleNamespace

import pytest
import torch
from torch import nn

from modelkv_exporter.engine import protocol
from modelkv_exporter.engine.publish import build_snapshot
from modelkv_exporter.engine.resolve import declaration_from_spec, resolve_owned
from modelkv_exporter.sidecar.reader.decode import parse_snapshot

omni = importlib.import_module("vllm_omni.model_executor.models.model_local_kv")
IMPLEMENTATIONS = [pytest.param(protocol, id="ours"), pytest.param(omni, id="vllm_omni")]


def spec(mod: ModuleType, **overrides: object) -> object:
    fields = dict(
        name="c",
        layers=8,
        kv_heads=16,
        head_dim=64,
        dtype=torch.float32,
        physical_capacity_positions=71,
        capacity_source="window",
        scope=mod.ModelLocalKVScope.REQUEST,
        rows=mod.RowDriver.MAX_NUM_SEQS,
    )
    fields.update(overrides)
    return mod.ModelLocalKVSpec(**fields)


def test_public_names_match_the_shipped_module() -> None:
    assert set(omni.__all__) <= set(protocol.__all__)
    assert {s.value for s in protocol.ModelLocalKVScope} == {s.value for s in omni.ModelLocalKVScope}
    assert {d.value for d in protocol.RowDriver} == {d.value for d in omni.RowDriver}
    ours = [f.name for f in protocol.ModelLocalKVSpec.__dataclass_fields__.values()]
    theirs = [f.name for f in omni.ModelLocalKVSpec.__dataclass_fields__.values()]
    assert ours == theirs


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float64])
@pytest.mark.parametrize("max_num_seqs", [0, 1, 7, 256])
@pytest.mark.parametrize("driver,fixed", [("MAX_NUM_SEQS", 1), ("FIXED", 1), ("FIXED", 15)])
def test_arithmetic_equals_vllm_omni(dtype: torch.dtype, max_num_seqs: int, driver: str, fixed: int) -> None:
    def build(mod: ModuleType) -> object:
        return spec(mod, dtype=dtype, rows=getattr(mod.RowDriver, driver), rows_fixed=fixed, rows_reason="r")

    ours, theirs = build(protocol), build(omni)
    assert (
        ours.bytes_per_row == theirs.bytes_per_row == 2 * 8 * 16 * 64 * 71 * torch.empty((), dtype=dtype).element_size()
    )
    assert ours.row_count(max_num_seqs) == theirs.row_count(max_num_seqs)
    assert ours.peak_bytes(max_num_seqs) == theirs.peak_bytes(max_num_seqs)
    resolved = declaration_from_spec("p", "Owner", theirs, max_num_seqs)
    assert resolved.peak_bytes == ours.peak_bytes(max_num_seqs)
    assert resolved.rows == driver.lower() and resolved.dtype == str(dtype).removeprefix("torch.")


@pytest.mark.parametrize("mod", IMPLEMENTATIONS)
def test_fixed_rows_need_a_positive_count_and_a_reason(mod: ModuleType) -> None:
    with pytest.raises(ValueError, match="rows_fixed"):
        spec(mod, rows=mod.RowDriver.FIXED, rows_fixed=0, rows_reason="x")
    with pytest.raises(ValueError, match="rows_reason"):
        spec(mod, rows=mod.RowDriver.FIXED, rows_fixed=2, rows_reason="  ")
    assert spec(mod, rows=mod.RowDriver.MAX_NUM_SEQS, rows_fixed=0).row_count(3) == 3


@pytest.mark.parametrize("mod", IMPLEMENTATIONS)
def test_spec_from_hf_config_resolves_like_the_contract(mod: ModuleType) -> None:
    common = dict(
        name="n",
        physical_capacity_positions=10,
        capacity_source="s",
        scope=mod.ModelLocalKVScope.MODEL,
        dtype=torch.bfloat16,
        rows=mod.RowDriver.MAX_NUM_SEQS,
    )
    qwen = SimpleNamespace(
        num_hidden_layers=24, num_key_value_heads=2, num_attention_heads=14, hidden_size=896, head_dim=64
    )
    got = mod.spec_from_hf_config(qwen, **common)
    assert (got.layers, got.kv_heads, got.head_dim) == (24, 2, 64)
    whisper = SimpleNamespace(encoder_layers=24, encoder_attention_heads=16, d_model=1024)
    got = mod.spec_from_hf_config(whisper, **common)
    assert (got.layers, got.kv_heads, got.head_dim) == (24, 16, 64)
    got = mod.spec_from_hf_config(whisper, layers=2, kv_heads=3, head_dim=5, **common)
    assert (got.layers, got.kv_heads, got.head_dim) == (2, 3, 5)
    with pytest.raises(ValueError, match="layer count"):
        mod.spec_from_hf_config(SimpleNamespace(), **common)
    with pytest.raises(TypeError):
        mod.spec_from_hf_config(qwen, **{k: v for k, v in common.items() if k != "rows"})


class Owner(nn.Module):
    def __init__(self, mod: ModuleType, name: str) -> None:
        super().__init__()
        self.mod, self.cache_name, self.calls = mod, name, 0

    def model_local_kv_specs(self) -> list[object]:
        self.calls += 1
        return [spec(self.mod, name=self.cache_name)]


class Raising(nn.Module):
    def model_local_kv_specs(self) -> list[object]:
        raise RuntimeError("declarer bug")


class RootOwner(nn.Module):
    def __init__(self, mod: ModuleType) -> None:
        super().__init__()
        self.mod = mod
        self.child = Owner(mod, "child_cache")

    def model_local_kv_specs(self) -> list[object]:
        return [spec(self.mod, name="root_cache")]


class GraphWrapper:
    """Like vLLM's CUDAGraphWrapper: not a module, forwards attributes, offers unwrap()."""

    def __init__(self, runnable: object) -> None:
        self.runnable = runnable

    def __getattr__(self, name: str) -> object:
        return getattr(self.runnable, name)

    def unwrap(self) -> object:
        return self.runnable


@pytest.mark.parametrize("mod", IMPLEMENTATIONS)
def test_collectors_agree_on_every_behaviour(mod: ModuleType, caplog: pytest.LogCaptureFixture) -> None:
    shared = Owner(mod, "shared_cache")
    model = RootOwner(mod)
    model.a = nn.Sequential(shared, Raising())
    model.b = shared
    wrapped = GraphWrapper(GraphWrapper(model))

    expected = [("", "root_cache"), ("child", "child_cache"), ("a.0", "shared_cache")]
    for collect in (protocol.collect_model_local_kv_specs, omni.collect_model_local_kv_specs):
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            got = collect(wrapped)
        assert [(path, s.name) for path, s in got] == expected
        assert any("raised on Raising" in r.getMessage() for r in caplog.records)
    assert shared.calls == 2
    assert protocol.collect_model_local_kv_specs(nn.Sequential(nn.Linear(2, 2))) == []
    assert protocol.collect_model_local_kv_specs(object()) == []


def test_owned_specs_carry_the_owner_class() -> None:
    model = nn.Module()
    model.decoder = Owner(omni, "x")
    (owned,) = protocol.collect_declarations(model).specs
    assert (owned.owner_path, owned.owner_class, owned.spec.name) == ("decoder", "Owner", "x")


def test_unwrap_stops_on_cycles_and_errors() -> None:
    class Cyclic:
        def unwrap(self) -> object:
            return self

    class Broken:
        def unwrap(self) -> object:
            raise RuntimeError

    for obj in (Cyclic(), Broken()):
        assert protocol.unwrap_model(obj) is obj


def test_duplicate_names_are_kept_and_renamed() -> None:
    owned = [protocol.OwnedSpec("d", "D", spec(protocol, name="c")) for _ in range(3)]
    names = [d.name for d in resolve_owned(owned, 4)[0]]
    assert names == ["c", "c#2", "c#3"]


def test_an_unresolvable_spec_is_skipped_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    bad = SimpleNamespace(name="bad", layers="many")
    good = spec(protocol, name="good")
    got, _ = resolve_owned([protocol.OwnedSpec("", "X", bad), protocol.OwnedSpec("", "X", good)], 2)
    assert [d.name for d in got] == ["good"]
    assert "cannot resolve" in caplog.text


class NotASequence(nn.Module):
    def model_local_kv_specs(self) -> object:
        return None


def test_dropped_declarations_are_recorded_in_the_snapshot_with_their_owners() -> None:
    """A declarer that raises, one that returns no sequence, and specs that cannot be resolved: counted by owner."""
    model = nn.Module()
    model.talker = nn.Module()
    model.talker.decoder = Raising()
    model.vocoder = NotASequence()

    class Half(nn.Module):
        def model_local_kv_specs(self) -> list[object]:
            bad = SimpleNamespace(name="bad", layers=None, rows="max_num_seqs")
            return [spec(protocol, name="good"), bad, bad]

    model.encoder = Half()
    snapshot = build_snapshot(model, max_num_seqs=4, engine_id="e")
    assert [d.name for d in snapshot.declarations] == ["good"]
    dropped = {(d.owner, d.owner_class, d.reason, d.count) for d in snapshot.dropped_declarations or ()}
    assert dropped == {
        ("talker.decoder", "Raising", "declarer_raised", 1),
        ("vocoder", "NotASequence", "declarer_raised", 1),
        ("encoder", "Half", "unresolvable_spec", 2),
    }
    errors = {d.owner: d.error for d in snapshot.dropped_declarations or ()}
    assert errors["talker.decoder"] == "RuntimeError: declarer bug"
    assert snapshot.dropped_count == 4
    again = parse_snapshot(snapshot.to_json())
    assert again.dropped_declarations == snapshot.dropped_declarations
    assert build_snapshot(nn.Linear(2, 2), max_num_seqs=1, engine_id="e").dropped_declarations == ()


def random_tree(rng: random.Random, mod: ModuleType) -> nn.Module:
    """A random module tree with owners, plain modules, None slots and modules shared between parents."""
    pool: list[nn.Module] = []
    root = nn.Module()
    frontier = [root]
    for i in range(rng.randint(1, 120)):
        parent = rng.choice(frontier)
        roll = rng.random()
        if roll < 0.15 and pool:
            child = rng.choice(pool)
            if any(child is m for m in parent.modules()) or any(parent is m for m in child.modules()):
                continue
        elif roll < 0.35:
            child = Owner(mod, f"c{i}")
        elif roll < 0.40:
            child = nn.Module()
            child.model_local_kv_specs = lambda i=i: [spec(mod, name=f"inst{i}")]  # instance-level declarer
        else:
            child = nn.Sequential()
        parent.add_module(f"m{i}", child)
        if roll < 0.42:
            parent.add_module(f"none{i}", None)
        pool.append(child)
        frontier.append(child)
    return root


def test_the_fast_walk_matches_named_modules_on_random_trees() -> None:
    rng = random.Random(7)
    for _ in range(300):
        model = random_tree(rng, omni)
        ours = [(p, s.name) for p, s in protocol.collect_model_local_kv_specs(model)]
        theirs = [(p, s.name) for p, s in omni.collect_model_local_kv_specs(model)]
        assert ours == theirs


INVALID = [
    pytest.param("scope", {"scope": ...}, "expected a string, got ellipsis", id="scope=... pasted"),
    pytest.param("scope", {"scope": "forever"}, "'forever' is not one of", id="scope=forever"),
    pytest.param("layers", {"layers": "6"}, "expected an integer, got str", id="layers='6'"),
    pytest.param("kv_heads", {"kv_heads": 2.5}, "expected an integer, got float", id="kv_heads=2.5"),
    pytest.param("physical_capacity_positions", {"physical_capacity_positions": -71}, "-71 is outside", id="negative"),
    pytest.param("rows", {"rows": "per_token"}, "'per_token' is not one of", id="rows=per_token"),
    pytest.param("name", {"name": ""}, "must have at least 1 character", id="empty name"),
]


@pytest.mark.parametrize("mod", IMPLEMENTATIONS)
@pytest.mark.parametrize("field,change,problem", INVALID)
def test_an_invalid_declaration_is_dropped_naming_its_field_and_the_rest_is_published(
    mod: ModuleType, field: str, change: dict[str, object], problem: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Before: published as it was (or coerced: kv_heads 2.5 as 2), and the sidecar rejected the whole snapshot,
    so every metric of the engine disappeared. Now the engine drops that one declaration, with the reason, and
    the sidecar reads the rest."""

    class Talker(nn.Module):
        def model_local_kv_specs(self) -> list[object]:
            return [spec(mod, name="good"), spec(mod, **{"name": "bad", **change})]

    model = nn.Module()
    model.talker = Talker()
    model.decoder = Owner(mod, "decoder")
    with caplog.at_level(logging.WARNING, logger="modelkv_exporter"):
        snapshot = build_snapshot(model, max_num_seqs=4, engine_id="e")
    assert [(d.owner, d.name) for d in snapshot.declarations] == [("talker", "good"), ("decoder", "decoder")]
    (dropped,) = snapshot.dropped_declarations or ()
    assert (dropped.owner, dropped.reason, dropped.count) == ("talker", "unresolvable_spec", 1)
    assert f"invalid field {field}: {problem}" in dropped.error
    warnings = [r for r in caplog.records if "dropping a declaration" in r.getMessage()]
    assert len(warnings) == 1 and f"invalid field {field}" in warnings[0].getMessage(), "logged once"
    read = parse_snapshot(snapshot.to_json())
    assert [d.name for d in read.declarations] == ["good", "decoder"] and read.dropped_count == 1


def test_no_field_of_a_declaration_is_coerced() -> None:
    """A float, a numeric string or a bool is the declarer's bug, not a value to round."""
    for value in (2.5, 2.0, "2", True):
        with pytest.raises(ValueError, match="invalid field kv_heads"):
            declaration_from_spec("", "X", spec(protocol, kv_heads=value), 2)
