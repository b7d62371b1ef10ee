"""A swarm that lists its trainers, as users run it: examples/train_digits.py as the listed trainer
reaches 95% through a testnet whose swarm file names only it; an unlisted trainer's backward on a
real `volunteer join` process is refused, changes nothing, and is one line in that volunteer's
log (and one error on the trainer's side)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from volunteer import Swarm
from volunteer.errors import ExpertBackwardRefusedError
from volunteer.experts.client import call_expert
from volunteer.net.identity import KeyPair

from .conftest import run_cli
from .test_testnet import start_testnet

ROOT = Path(__file__).resolve().parents[2]
RUN_LIMIT = 400


def test_the_listed_trainer_trains_digits_to_95_percent():
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "train_digits.py"), "--listed-trainer",
                             "--epochs", "25"], capture_output=True, text=True, timeout=RUN_LIMIT, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "training as listed trainer" in result.stdout
    assert "reached 95% test accuracy" in result.stdout
    # the testnet's directory (its volunteers' private keys) goes with it
    swarm_file = Path(next(w for w in result.stdout.split() if w.endswith("digits.toml")))
    testnet_dir = swarm_file.parents[2]
    assert testnet_dir.name.startswith("digits-testnet-") and not testnet_dir.exists()


def test_an_unlisted_trainer_is_refused_in_one_line_and_changes_nothing(tmp_path, cli_env):
    listed = KeyPair.generate()
    proc, _ = start_testnet(tmp_path, cli_env, 1, "--trainer", str(listed.peer_id))
    try:
        swarm = Swarm.join(tmp_path / "net" / "swarm.toml")  # a fresh key: not listed
        with swarm:
            async def backward_once() -> tuple[int, int]:
                hosts = await swarm.directory.find_grid("expert", (2, 2))
                peer = hosts["expert.0.0"][0].peer
                info = await call_expert(swarm.host, peer, "expert.0.0", "info", swarm_id=swarm.swarm_id)
                x = torch.randn(4, 8)
                await call_expert(swarm.host, peer, "expert.0.0", "forward", [x], swarm_id=swarm.swarm_id)
                refused = 0
                for _ in range(3):
                    try:
                        await call_expert(swarm.host, peer, "expert.0.0", "backward", [x, torch.ones(4, 8)],
                                          swarm_id=swarm.swarm_id, n_inputs=1)
                    except ExpertBackwardRefusedError as exc:
                        assert "not an admitted trainer" in str(exc) and "not among them" in str(exc)
                        refused += 1
                after = await call_expert(swarm.host, peer, "expert.0.0", "info", swarm_id=swarm.swarm_id)
                return refused, after["updates"] - info["updates"]

            refused, updates = swarm.loop.run(backward_once, timeout=60)
        assert refused == 3 and updates == 0
        log = (tmp_path / "net" / "v0.log").read_text()
        lines = [line for line in log.splitlines() if "not an admitted trainer" in line]
        assert len(lines) == 1, log[-2000:]  # one line for the three refusals; the rest are counted
        status = json.loads(run_cli("status", "--json", "--control", str(tmp_path / "net" / "v0.sock"), env=cli_env).stdout)
        assert status["refusals"]["experts"]["trainer_not_admitted"] == 3
        assert "1 listed trainer" in status["trainers"]["policy"]
    finally:
        proc.terminate()
        proc.communicate(timeout=60)  # reads and closes its output
