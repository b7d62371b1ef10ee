"""Our experts trained by an unmodified hivemind 1.1.12 trainer (its own venv, its own p2pd).

Our node is started as `volunteer join SWARMFILE` starts it: ``open_volunteer`` on a swarm file
that says ``kind = "hivemind"``. hivemind's RemoteMixtureOfExperts finds experts our node declared in the hivemind DHT, trains a
few hundred steps against them (forward and backward through our runtime) and its loss falls; a
wrong-shaped call comes back to it as hivemind's remote error, and our node keeps serving.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
from pathlib import Path

import pytest
import trio

from volunteer.cli import views
from volunteer.hivemind.experts import HivemindExperts
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.swarmfile import load_swarm_file

from .test_hivemind_dht import QUIET, hivemind_python

pytestmark = pytest.mark.interop

TRAINER = Path(__file__).parent / "peers" / "hivemind_trainer.py"
HIDDEN = 16
GRID = 4


async def run_trainer(initial_peer: str, *args: str, timeout: float = 240) -> dict:
    """Run the hivemind trainer to the end (its process group killed whatever happens)."""
    python = hivemind_python()
    with tempfile.TemporaryDirectory(prefix="hm-trainer-") as tmp:
        log = Path(tmp) / "stderr.log"
        with open(log, "wb") as err:
            process = await trio.lowlevel.open_process(
                [str(python), str(TRAINER), *args, initial_peer], stdout=subprocess.PIPE, stderr=err,
                start_new_session=True, cwd=tmp,
            )
        output = b""
        try:
            with trio.fail_after(timeout):
                while chunk := await process.stdout.receive_some(65536):
                    output += chunk
                await process.wait()
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # p2pd is a child in the same group
            except ProcessLookupError:
                pass
            with trio.CancelScope(shield=True):
                await process.wait()
        lines = [line for line in output.decode().splitlines() if line.startswith("{")]
        if process.returncode != 0 or not lines:
            raise AssertionError(f"hivemind trainer failed ({process.returncode}): {log.read_text()[-4000:]}")
        return json.loads(lines[-1])


@pytest.mark.trio_timeout(300)
async def test_an_unmodified_hivemind_moe_trains_against_our_experts(tmp_path):
    swarm_file = tmp_path / "hm.toml"
    swarm_file.write_text('name = "hm"\nkind = "hivemind"\n[experts]\nexperts = "ffn:ffn.[0:4]"\n')
    spec = load_swarm_file(swarm_file)
    options = VolunteerOptions(
        listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, nat=False, mdns=False, device="cpu",
        expert_class="ffn", uids=[f"ffn.{i}" for i in range(GRID)], hidden_dim=HIDDEN,
    )
    async with open_volunteer(spec, options) as node:
        result = await run_trainer(
            str(node.host.full_addrs()[0]), "--hidden", str(HIDDEN), "--grid", str(GRID), "--steps", "200"
        )
        print("hivemind trainer:", result)
        assert result["last"] < result["first"] * 0.7, result
        backends = node.runtime.backends.values()
        assert sum(backend.updates for backend in backends) >= 200  # backward ran on our side
        assert "ExpertInputError" in result["wrong_shape_error"], result
        assert result["after_error_shape"] == [3, HIDDEN]
        experts = node.host.service(HivemindExperts)
        assert experts is not None and experts.errors >= 1 and experts.refusals["backward_without_forward"] == 0
        assert views.dht_view(node)["experts_declared"] == GRID
