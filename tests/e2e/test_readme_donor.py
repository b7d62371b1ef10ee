"""Every ``volunteer`` command README.md's donor section shows works as written, in the order it
shows them, against a local swarm named "demo" (a relay on loopback and its swarm file, saved
both as ./demo.toml and as a named swarm). Lines that install or manage the system (git, pip,
systemctl, journalctl) are not run here; ``MULTIADDR`` stands for the relay's address."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from volunteer.net.identity import KeyPair

from .conftest import JoinProcess, run_cli
from .test_metrics_and_paths import stop
from .test_relay_cli import start_relay

README = Path(__file__).resolve().parents[2] / "README.md"


def donor_commands() -> list[str]:
    """The ``volunteer`` lines of the bash blocks of README's "Donating a GPU" section, less comments."""
    text = README.read_text()
    section = text.split("## Donating a GPU", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, flags=re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words and words[0] == "volunteer":
                commands.append(shlex.join(words))
    return commands


def unquoted_globs(line: str) -> list[str]:
    """The characters of a shell line that zsh (and bash with failglob) takes as a file pattern:
    ``[``, ``*`` and ``?`` outside quotes and before a comment."""
    found, quote = [], ""
    for index, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1].isspace()):
            break
        elif char in "[*?":
            found.append(char)
    return found


def test_unquoted_globs_are_found():
    assert unquoted_globs("volunteer join x --experts ffn:expert.[0:4]") == ["["]
    assert unquoted_globs("volunteer join x --experts 'ffn:expert.[0:4]'  # [[grid]]") == []


def test_every_volunteer_command_of_the_readme_works_in_zsh_too():
    text = README.read_text()
    for block in re.findall(r"```(?:bash|sh|shell)\n(.*?)```", text, flags=re.S):
        for line in block.splitlines():
            if line.strip().startswith("volunteer "):
                assert not unquoted_globs(line), f"quote the pattern (zsh expands it): {line}"


def test_the_first_join_relies_on_the_swarm_files_grid():
    """The README's swarm file declares a [[grid]]: its first join names no experts by hand."""
    text = README.read_text()
    section = text.split("## Donating a GPU", 1)[1]
    assert "[[grid]]" in section.split("```toml", 1)[1].split("```", 1)[0]
    first_join = next(c for c in donor_commands() if c.split()[1] == "join")
    assert "--experts" not in first_join, first_join


def test_the_donor_section_shows_the_donor_verbs():
    commands = donor_commands()
    for verb in ("join", "status", "pause", "fold", "finish", "history", "stop"):
        assert any(c.split()[1] == verb for c in commands), verb


@pytest.mark.slow
def test_every_donor_command_of_the_readme_works_as_written(tmp_path, cli_env):
    relay, relay_addr, _ = start_relay(tmp_path, "--swarm", "demo")
    env = {**os.environ, **cli_env, "PYTHONUNBUFFERED": "1"}
    (tmp_path / "run").mkdir(mode=0o700)  # as a login session's XDG_RUNTIME_DIR is
    # the README's swarm file declares a grid, which its first join relies on (small experts here)
    swarm = (f'name = "demo"\nrelays = ["{relay_addr}"]\n'
             '[[grid]]\nprefix = "expert"\nsize = [4, 8]\nexpert = "ffn"\nhidden_dim = 16\nreplicas = 1\n')
    (tmp_path / "demo.toml").write_text(swarm)
    (tmp_path / "config" / "volunteer" / "swarms").mkdir(parents=True, exist_ok=True)
    (tmp_path / "config" / "volunteer" / "swarms" / "demo.toml").write_text(swarm)
    daemon: JoinProcess | None = None
    ran = []
    try:
        trainer = str(KeyPair.generate().peer_id)  # TRAINER-ID: a trainer's `volunteer id`
        for command in donor_commands():
            words = [relay_addr if w == "MULTIADDR" else trainer if w == "TRAINER-ID" else w for w in shlex.split(command)]
            output = None
            if ">" in words:  # `... > FILE`: what the shell would write there
                words, output = words[:words.index(">")], words[words.index(">") + 1]
            argv = [sys.executable, "-m", "volunteer", *words[1:]]
            if words[1] == "join":
                if daemon is not None:
                    assert daemon.stop() == 0
                daemon = JoinProcess([*words[1:], "--no-dashboard", "--listen", "/ip4/127.0.0.1/tcp/0"], env=env, cwd=tmp_path,
                                     timeout=90)
                started = "".join(daemon.lines)
                first = not any(c.split()[1] == "join" for c in ran)
                # the first start on this machine, without a terminal, waits for `volunteer fold`,
                # which the README runs next; that consent is remembered for later starts
                assert ("not joining yet: nothing is joined" in started) == first, started
                # the estimate the README promises, before the experts are built
                assert "memory estimate: 8 experts × " in started and " on cpu, of " in started, started
                ran.append(command)
                continue
            result = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
            assert result.returncode == 0, f"{command}: {result.stderr or result.stdout}"
            assert "Traceback" not in result.stderr, command
            if output is not None:
                (tmp_path / output).write_text(result.stdout)
            ran.append(command)
            if words[1:] == ["stop"]:
                stopped, daemon = daemon, None
                assert stopped is not None and stopped.stop(None) == 0
            if words[1:] == ["status", "--json"]:
                assert json.loads(result.stdout)["swarm"] == "demo"
        assert daemon is not None
        status = json.loads(run_cli("status", "--json", env=env).stdout)
        # the last join shown is the policies example: its settings reached the daemon
        assert status["policy"]["settings"]["pause_programs"] == ["steam"]
        assert status["policy"]["settings"]["compute_hours"] == ["22:00-07:00"]
    finally:
        if daemon is not None:
            daemon.stop()
        stop(relay)
    assert len(ran) == len(donor_commands())
