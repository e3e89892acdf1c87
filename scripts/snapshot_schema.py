"""The snapshot's JSON Schema and field reference, derived from the dataclasses' field declarations.

``python -m scripts.docgen`` writes them to ``docs/snapshot.schema.json`` and
into ``docs/snapshot-format.md``; a test fails when either differs from a fresh derivation.
The schema says what a field declaration says; of the checks beyond the fields
(``CHECKS_BEYOND_FIELDS``) it expresses the one JSON Schema can (per-sequence rows need
``max_num_seqs``) and names the others in its description.
"""

from __future__ import annotations

import json
import re
from typing import Any

from modelkv_exporter.contract.fields import MAX_INT, MAX_NUMBER, REQUIRED, FieldInfo, fields_of
from modelkv_exporter.contract.snapshot import CHECKS_BEYOND_FIELDS, SCHEMA_VERSION, VERSION_FIELD, Snapshot
from modelkv_exporter.contract.vocabulary import RowDriver


def definition_name(cls: type) -> str:
    """A dataclass's name in ``$defs``: ``EngineIdentity`` -> ``engine_identity``."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cls.__name__).lower()


def accepts_null(info: FieldInfo) -> bool:
    """Whether a document may write null for the field: it is nullable or has a reader's default (a boolean never)."""
    return info.nullable or (info.rule.absent is not REQUIRED and info.kind != "boolean")


def _value_schema(info: FieldInfo) -> dict[str, Any]:
    """The schema of a present, non-null value of the field."""
    rule = info.rule
    if info.kind == "integer":
        return {"type": "integer", "minimum": int(rule.minimum), "maximum": int(rule.maximum or MAX_INT)}
    if info.kind == "number":
        return {"type": "number", "minimum": rule.minimum, "maximum": rule.maximum or MAX_NUMBER}
    if info.kind == "boolean":
        return {"type": "boolean"}
    if info.kind == "text":
        if rule.choices is not None:
            return {"enum": sorted(rule.choices)}
        text: dict[str, Any] = {"type": "string"}
        if rule.min_length:
            text["minLength"] = rule.min_length
        if rule.max_length is not None:
            text["maxLength"] = rule.max_length
        if rule.pattern is not None:
            text["pattern"] = f"^{rule.pattern}$"
        return text
    if info.kind == "counts":
        return {
            "type": "object",
            "propertyNames": {"pattern": f"^{rule.pattern}$"},
            "additionalProperties": {"type": "integer", "minimum": 0, "maximum": MAX_INT},
        }
    assert info.nested is not None
    reference = {"$ref": f"#/$defs/{definition_name(info.nested)}"}
    if info.kind != "list":
        return reference
    listing: dict[str, Any] = {"type": "array", "items": reference}
    if rule.max_length is not None:
        listing["maxItems"] = rule.max_length
    return listing


def field_schema(info: FieldInfo) -> dict[str, Any]:
    """The schema of the field as a document may write it (null too where a reader takes null as absent)."""
    value = _value_schema(info)
    if accepts_null(info):
        value = {"anyOf": [value, {"type": "null"}]}
    return {"description": info.rule.meaning, **value}


def object_schema(cls: type) -> dict[str, Any]:
    """The schema of one snapshot dataclass's object: its fields, and those every document must carry."""
    fields = fields_of(cls)
    schema: dict[str, Any] = {"type": "object", "description": (cls.__doc__ or "").split("\n")[0]}
    required = [f.name for f in fields if f.required]
    if required:
        schema["required"] = required
    schema["properties"] = {f.name: field_schema(f) for f in fields}
    return schema


def _classes(cls: type) -> list[type]:
    """``cls`` and every dataclass its fields hold, depth first, each once."""
    found = [cls]
    for info in fields_of(cls):
        if info.nested is not None and info.nested not in found:
            found += [c for c in _classes(info.nested) if c not in found]
    return found


def _versioned_requirements() -> list[dict[str, Any]]:
    """One ``if``/``then`` per field required only in older versions, at its path from the root."""
    clauses = []

    def walk(cls: type, path: tuple[str, ...]) -> None:
        for info in fields_of(cls):
            if info.rule.required_below is not None:
                then: dict[str, Any] = {"required": [info.name], "properties": {info.name: _value_schema(info)}}
                for key in reversed(path):
                    then = {"properties": {key: then}}
                older = {"properties": {"schema_version": {"maximum": info.rule.required_below - 1}}}
                clauses.append({"if": older, "then": then})
            if info.kind == "object" and info.nested is not None:
                walk(info.nested, (*path, info.name))

    walk(Snapshot, ())
    return clauses


def json_schema() -> dict[str, Any]:
    """``docs/snapshot.schema.json``."""
    root = object_schema(Snapshot)
    root["required"] = [VERSION_FIELD.name, *root["required"]]
    root["properties"] = {VERSION_FIELD.name: field_schema(VERSION_FIELD), **root["properties"]}
    fixed_rows_without_max_num_seqs = {
        "if": {"properties": {"settings": {"properties": {"max_num_seqs": {"type": "null"}}}}},
        "then": {"properties": {"declarations": {"items": {"properties": {"rows": {"const": RowDriver.FIXED.value}}}}}},
    }
    checks = "; ".join(CHECKS_BEYOND_FIELDS)
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://modelkv-exporter.invalid/snapshot-v1.schema.json",
        "title": f"modelkv-exporter engine snapshot, {VERSION_FIELD.name} 1 to {SCHEMA_VERSION}",
        "description": (
            "One engine process's declarations and measured memory; generated from modelkv_exporter/contract/"
            "snapshot.py by python -m scripts.docgen, do not edit. Readers ignore unknown fields; see "
            f"docs/snapshot-format.md. The reader also checks: {checks}."
        ),
        **{k: v for k, v in root.items() if k not in ("description",)},
        "allOf": [*_versioned_requirements(), fixed_rows_without_max_num_seqs],
        "$defs": {definition_name(c): object_schema(c) for c in _classes(Snapshot)[1:]},
    }


def json_schema_text() -> str:
    """``docs/snapshot.schema.json`` as written: two-space indents, a final newline."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


def _bounds(info: FieldInfo) -> str:
    """A field's JSON type and bounds, in words."""
    rule = info.rule
    if info.kind == "integer":
        if rule.maximum is not None:
            return f"integer in [{rule.minimum:g}, {rule.maximum:g}]"
        return "integer ≥ 1" if rule.minimum >= 1 else "integer ≥ 0"
    if info.kind == "number":
        return f"number in [0, {rule.maximum:g}]" if rule.maximum is not None else "number in [0, 1e15]"
    if info.kind == "boolean":
        return "true or false"
    if info.kind == "counts":
        return "object: plain name → integer ≥ 0"
    if info.kind == "text":
        if rule.choices is not None:
            return "one of " + ", ".join(f"`{c}`" for c in sorted(rule.choices))
        if rule.pattern is not None:
            return "plain name (`a-z`, `0-9`, `_`; at most 64)"
        if rule.max_length is not None:
            return f"string, {rule.min_length} to {rule.max_length} characters"
        return "non-empty string" if rule.min_length else "string"
    assert info.nested is not None
    name = definition_name(info.nested)
    if info.kind != "list":
        return f"`{name}` object"
    return f"list of `{name}`" + (f", at most {rule.max_length}" if rule.max_length is not None else "")


def _presence(info: FieldInfo) -> str:
    """Whether a document must carry the field (a missing or null optional field reads as its default)."""
    rule = info.rule
    if rule.required_below is not None:
        return f"required below version {rule.required_below}, then optional"
    if rule.absent is REQUIRED:
        return "required"
    if info.kind == "boolean":
        return f"optional (missing: `{json.dumps(rule.absent)}`)"
    return "optional"


def field_reference() -> str:
    """The field reference table of ``docs/snapshot-format.md``: every field, by its path from the root."""
    lines = ["| field | value | presence | meaning |", "|---|---|---|---|"]

    def row(info: FieldInfo, path: str) -> None:
        lines.append(f"| `{path}` | {_bounds(info)} | {_presence(info)} | {info.rule.meaning} |")

    def walk(cls: type, prefix: str) -> None:
        for info in fields_of(cls):
            path = f"{prefix}{info.name}"
            row(info, path)
            if info.nested is not None:
                walk(info.nested, f"{path}[]." if info.kind == "list" else f"{path}.")

    row(VERSION_FIELD, VERSION_FIELD.name)
    walk(Snapshot, "")
    return "\n".join(lines)


def reader_checks() -> str:
    """The checks beyond the fields, as a Markdown list."""
    return "\n".join(f"- {check}" for check in CHECKS_BEYOND_FIELDS)
