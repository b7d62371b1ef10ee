"""Our experts trained by an unmodified hivemind 1.1.12 trainer (its own venv, its own p2pd).

hivemind's RemoteMixtureOfExperts finds experts our node declared in the hivemind DHT, trains a
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

from volunteer.experts import ExpertsConfig, make_backend, open_runtime
from volunteer.hivemind import HivemindDHT, HivemindExperts
from volunteer.net.host import open_host

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
async def test_an_unmodified_hivemind_moe_trains_against_our_experts():
    config = ExpertsConfig(device="cpu")
    backends = [make_backend(f"ffn.{i}", "ffn", HIDDEN, config=config) for i in range(GRID)]
    async with open_runtime(backends, config) as runtime:
        dht = HivemindDHT()
        experts = HivemindExperts(runtime, dht=dht, config=config)
        async with open_host(listen=["/ip4/127.0.0.1/tcp/0"], config=QUIET, services=[dht, experts]) as host:
            result = await run_trainer(
                str(host.full_addrs()[0]), "--hidden", str(HIDDEN), "--grid", str(GRID), "--steps", "200"
            )
            print("hivemind trainer:", result)
            assert result["last"] < result["first"] * 0.7, result
            assert sum(backend.updates for backend in backends) >= 200  # backward ran on our side
            assert "ExpertInputError" in result["wrong_shape_error"], result
            assert result["after_error_shape"] == [3, HIDDEN]
            assert experts.errors >= 1 and experts.refusals["backward_without_forward"] == 0
