"""What every `jgpt` command's parser shares: help that shows defaults and choices, and the version.

Every command builds its parser from `ArgumentParser` here; `argparse` gives sub-parsers the
parser's own class, so `jgpt kvsim run --help` formats like `jgpt kvsim --help`. Importing this
module must stay cheap (no jax): `--help` of every command goes through it.
"""

from __future__ import annotations

import argparse
from importlib import metadata

PACKAGE = "jgpt"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions and examples as written; each option's help ends with its default, if it has one,
    and with its choices where a metavar hides them (argparse lists them in place of a missing metavar)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.choices is not None and action.metavar is not None and not isinstance(action.choices, dict):
            text += f" (one of: {', '.join(map(str, action.choices))})"
        if "%(default)" not in text and _shown(action):
            text += " (default: %(default)s)"
        return text


def _shown(action: argparse.Action) -> bool:
    """Whether a default says something: not for flags (False), unset options (None) or empty lists."""
    default = action.default
    takes_default = action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE)
    unset = default is None or default is False or default is argparse.SUPPRESS or default == []
    return bool(takes_default) and not unset


class ArgumentParser(argparse.ArgumentParser):
    """An `argparse.ArgumentParser` with `HelpFormatter` unless told otherwise."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)


def version() -> str:
    """The installed package's version (pyproject.toml), or a note when jgpt runs from an uninstalled tree."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return "(not installed: run `pip install -e .`)"
