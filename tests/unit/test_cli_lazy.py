"""The CLI imports only the module of the command it runs (start-up time of `volunteer perf`)."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from volunteer.cli import main as cli


def registered_by(module_name: str) -> set[str]:
    """The command names one sub-command module registers."""
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    importlib.import_module(f"volunteer.cli.{module_name}").add_parsers(sub)
    return set(sub.choices)


def test_command_table_matches_what_the_modules_register():
    for module_name in cli.COMMAND_MODULES:
        for command in registered_by(module_name):
            assert cli.COMMAND_MODULE[command] == module_name
    assert set(cli.COMMAND_MODULE.values()) == set(cli.COMMAND_MODULES)
    full = cli.build_parser()
    subparsers = next(a for a in full._actions if isinstance(a, argparse._SubParsersAction))
    assert set(subparsers.choices) == set(cli.COMMAND_MODULE)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["perf", "--json", "/ip4/127.0.0.1/tcp/1"], "perf"),
        (["-v", "-v", "ping", "x"], "ping"),
        (["--version"], None),
        ([], None),
        (["nosuchcommand"], None),
        (["--", "perf"], None),
    ],
)
def test_command_named(argv, expected):
    assert cli.command_named(argv) == expected


def test_one_command_parser_parses_like_the_full_one():
    argv = ["-v", "perf", "--upload", "1MiB", "--download", "2MiB", "--json", "/ip4/127.0.0.1/tcp/4001"]
    lazy = cli.parse(cli.build_parser("perf"), argv)
    full = cli.parse(cli.build_parser(), argv)
    assert (lazy.command, lazy.upload, lazy.download, lazy.json, lazy.verbose) == ("perf", 1 << 20, 2 << 20, True, 1)
    assert vars(lazy) == vars(full)


@pytest.mark.slow
def test_perf_command_imports_neither_dht_nor_node_nor_torch_nor_rich():
    # A fresh interpreter: this test process has imported everything already.
    code = (
        "import sys\n"
        "from volunteer.cli.main import build_parser, command_named\n"
        "build_parser(command_named(['perf', '/ip4/127.0.0.1/tcp/1']))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'zeroconf', 'rich')"
        " or m.startswith(('volunteer.dht', 'volunteer.node', 'volunteer.experts', 'volunteer.cli.joincmd'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_relay_with_its_health_page_loads_neither_torch_nor_the_experts():
    # A relay runs on a small public box: its health page reads trainers' vouches (dht/vouches.py),
    # which must not drag in the experts' package and torch with it.
    code = (
        "import sys\n"
        "import relay.node, relay.healthservice, relay.healthpage, volunteer.cli.relaycmd\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m.startswith('volunteer.experts')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"
