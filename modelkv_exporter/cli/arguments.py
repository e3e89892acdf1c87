"""Command-line flags from a command's settings table, with defaults from ``MODELKV_`` variables.

A command reads and checks only its own variables, after it was chosen, and names itself in
any complaint: a bad variable of one command never stops another. A setting's former names (its
``aliases``) are still taken, as a flag or a variable, each with a warning naming the new one.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from modelkv_exporter.contract.settings import REQUIRED, Setting, Table


def _parser_for(setting: Setting) -> Any:
    def parse(text: str) -> Any:
        try:
            return setting.parse(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from None

    return parse


class _Store(argparse.Action):
    """Stores the value; given under a former name of the setting, says which name to use instead."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if option_string is not None and option_string != self.option_strings[0]:
            warn(parser, f"{option_string} is deprecated: use {self.option_strings[0]}")
        setattr(namespace, self.dest, values)


def warn(parser: argparse.ArgumentParser, message: str) -> None:
    """One warning line on standard error, named after the command."""
    print(f"{parser.prog}: warning: {message}", file=sys.stderr)


def add_settings(parser: argparse.ArgumentParser, table: Table) -> None:
    """Add every setting of ``table`` to ``parser``; ``apply_environment`` fills the rest after parsing."""
    for setting in table.settings():
        declared = setting.defaults[table.program]
        shown = "; required" if declared is REQUIRED else "" if declared is None else f"; default {declared}"
        former = f" (formerly {', '.join(setting.alias_flags)}, deprecated)" if setting.aliases else ""
        parser.add_argument(
            setting.flag,
            *setting.alias_flags,
            action=_Store,
            dest=setting.dest,
            type=_parser_for(setting),
            default=None,
            metavar=setting.dest.upper(),
            help=f"{setting.help_for(table.program)}{former} [env {setting.env}{shown}]".replace("%", "%%"),
        )


def apply_environment(
    parser: argparse.ArgumentParser, args: argparse.Namespace, table: Table, environ: Mapping[str, str]
) -> None:
    """Fill each setting not given as a flag from its variable or default; a bad or missing value ends the command."""
    values, problems = table.from_environ(environ)
    for notice in table.deprecated(environ):
        warn(parser, notice)
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

    argparse takes ``-5MiB`` after ``--budget`` for an unknown option and says only "expected one
    argument"; joined as ``--budget=-5MiB``, the value reaches the setting's parser, whose error
    names it. Every setting takes a value, so nothing else changes meaning.
    """
    flags = {
        flag
        for table in tables.values()
        for setting in table.settings()
        for flag in (setting.flag, *setting.alias_flags)
    }
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
