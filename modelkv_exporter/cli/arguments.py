"""Command-line flags from a command's settings table, with defaults from ``MODELKV_`` variables.

A command reads and checks only its own variables, after it was chosen, and names itself in
any complaint: a bad variable of one command never stops another.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from typing import Any

from modelkv_exporter.contract.settings import REQUIRED, Setting, Table


def _parser_for(setting: Setting) -> Any:
    def parse(text: str) -> Any:
        try:
            return setting.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


def add_settings(parser: argparse.ArgumentParser, table: Table) -> None:
    """Add every setting of ``table`` to ``parser``; ``apply_environment`` fills the rest after parsing."""
    for setting in table.settings():
        declared = setting.defaults[table.program]
        shown = "; required" if declared is REQUIRED else "" if declared is None else f"; default {declared}"
        parser.add_argument(
            setting.flag,
            dest=setting.dest,
            type=_parser_for(setting),
            default=None,
            metavar=setting.dest.upper(),
            help=f"{setting.help_for(table.program)} [env {setting.env}{shown}]".replace("%", "%%"),
        )


def apply_environment(
    parser: argparse.ArgumentParser, args: argparse.Namespace, table: Table, environ: Mapping[str, str]
) -> None:
    """Fill each setting not given as a flag from its variable or default; a bad or missing value ends the command."""
    values, problems = table.from_environ(environ)
    for setting in table.settings():
        if getattr(args, setting.dest, None) is not None:
            continue
        if setting.dest in problems:
            parser.error(problems[setting.dest])
        setattr(args, setting.dest, values[setting.dest])
        if setting.defaults[table.program] is REQUIRED and values[setting.dest] is None:
            parser.error(f"{setting.flag} (or {setting.env}) is required")


_DASHED_VALUE = re.compile(r"-\s*\d")


def attach_dashed_values(argv: list[str], tables: Mapping[str, Table]) -> list[str]:
    """``argv`` with each setting's flag joined to a following value that starts with a dash and a digit.

    argparse takes ``-5MiB`` after ``--cache-memory`` for an unknown option and says only "expected
    one argument"; joined as ``--cache-memory=-5MiB``, the value reaches the setting's parser, whose error
    names it. Every setting takes a value, so nothing else changes meaning.
    """
    flags = {setting.flag for table in tables.values() for setting in table.settings()}
    joined: list[str] = []
    index = 0
    while index < len(argv):
        word = argv[index]
        if word in flags and index + 1 < len(argv) and _DASHED_VALUE.match(argv[index + 1]):
            joined.append(f"{word}={argv[index + 1]}")
            index += 2
        else:
            joined.append(word)
            index += 1
    return joined
