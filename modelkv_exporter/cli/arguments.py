"""Command-line flags from a command's settings table, with defaults from ``MODELKV_`` variables.

A command reads and checks only its own variables, after it was chosen, and names itself in
any complaint: a bad variable of one command never stops another.
"""

from __future__ import annotations

import argparse
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
