"""A setting is a field of a typed object: the programs that build the object read it, by flag and variable."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from modelkv_exporter.contract.setting_values import number
from modelkv_exporter.contract.settings import REQUIRED, SPOOL_DIR, Setting, Table, build, group, setting


@dataclass(frozen=True)
class Limits:
    max_things: int = setting(8, int, "Most things.")
    timeout: float = setting(1.5, number, "Seconds to wait.")


@dataclass(frozen=True)
class Config:
    directory: Path
    level: str = setting("info", str, "How much to say.")
    limits: Limits = group(Limits, "wire_")
    alias: str | None = setting(None, str, "Spelled otherwise.")
    not_a_setting: int = 3


def test_every_field_made_by_setting_is_a_flag_and_a_variable_of_the_program() -> None:
    table = Table("prog", (Config,), defaults={"wire_max_things": 16, "level": REQUIRED}, notes={"alias": "Or not."})
    rows = {row.dest: row for row in table.settings()}
    assert list(rows) == ["spool_dir", "level", "wire_max_things", "wire_timeout", "alias"]
    assert rows["spool_dir"].help == SPOOL_DIR.help and rows["spool_dir"].defaults == {"prog": None}
    assert (rows["wire_max_things"].flag, rows["wire_max_things"].env) == (
        "--wire-max-things",
        "MODELKV_WIRE_MAX_THINGS",
    )
    assert rows["wire_max_things"].defaults == {"prog": 16} and rows["wire_timeout"].defaults == {"prog": 1.5}
    assert rows["level"].defaults == {"prog": REQUIRED}
    assert rows["alias"].help_for("prog") == "Spelled otherwise. Or not."


def test_a_typed_object_is_built_from_what_a_table_read() -> None:
    table = Table("prog", (Config,))
    values, problems = table.from_environ({"MODELKV_WIRE_TIMEOUT": "2", "MODELKV_ALIAS": "x", "MODELKV_LEVEL": " "})
    assert problems == {}
    config = build(Config, values, directory=Path("/d"))
    assert config == Config(Path("/d"), "info", Limits(8, 2.0), "x")
    _, problems = table.from_environ({"MODELKV_WIRE_TIMEOUT": "soon"})
    assert problems == {"wire_timeout": "MODELKV_WIRE_TIMEOUT='soon': 'soon' is not a number"}


def test_a_table_refuses_a_name_twice_and_a_default_of_no_setting() -> None:
    with pytest.raises(ValueError, match="named twice \\['alias', 'level'"):
        Table("prog", (Config, Config)).settings()
    with pytest.raises(ValueError, match="unknown \\['levle'\\]"):
        Table("prog", (Config,), defaults={"levle": "debug"}).settings()


def test_a_setting_is_named_as_its_field_and_by_nothing_else() -> None:
    """One name per setting: no former name is read (0.1.0 was never released, so no one set one)."""
    assert "aliases" not in Setting.__dataclass_fields__
    table = Table("prog", (Config,))
    assert [row.dest for row in table.settings()] == ["spool_dir", "level", "wire_max_things", "wire_timeout", "alias"]
    assert table.from_environ({"MODELKV_RENAMED": "x"})[0]["alias"] is None
