"""Every example command in the README and in ``--help`` can be pasted into zsh: a grid pattern
such as ``ffn:expert.[0:4].[0:8]`` is a glob there (``no matches found``), so it must be quoted."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from volunteer.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
# a shell word with a [a:b] range that does not start with a quote (a glob in zsh, and in bash
# whenever a file of a matching name exists)
UNQUOTED_RANGE = re.compile(r"(?:^|\s)(?!['\"])[^\s'\"]*\[\d+:\d+\]")


def unquoted(lines: list[str]) -> list[str]:
    """The lines that run ``volunteer`` (or an example script) with an unquoted [a:b] range."""
    commands = [line for line in lines if re.search(r"\bvolunteer (join|testnet|experts)\b|examples/\S+\.py", line)]
    return [line for line in commands if UNQUOTED_RANGE.search(line.split("#")[0])]


def readme_code_lines() -> list[str]:
    lines, inside = [], False
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            inside = not inside
        elif inside:
            lines.append(line)
    return lines


def help_texts() -> list[str]:
    parser = cli.build_parser()
    texts = [parser.format_help()]
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    texts += [sub.format_help() for sub in subparsers.choices.values()]
    return [line for text in texts for line in text.splitlines()]


def test_the_pattern_finds_an_unquoted_range_and_passes_a_quoted_one():
    assert unquoted(["  volunteer join ./demo.toml --experts ffn:expert.[0:4].[0:8]"])
    assert not unquoted(["  volunteer join ./demo.toml --experts 'ffn:expert.[0:4].[0:8]'"])


def test_readme_commands_quote_their_grid_patterns():
    assert unquoted(readme_code_lines()) == []


def test_help_examples_quote_their_grid_patterns():
    assert unquoted(help_texts()) == []
