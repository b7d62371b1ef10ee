"""Our trainer against experts that real ``hivemind.moe.Server`` processes host (hivemind 1.1.12 in
its own venv, its own p2pd): ``Swarm.join`` of a ``kind = "hivemind"`` spec, our
``RemoteMixtureOfExperts`` trains and its loss falls; a hivemind server killed mid-training is
routed around, its calls failing with our error types. Every hivemind process group is killed."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

import pytest
import torch

from volunteer import RemoteExpert, RemoteMixtureOfExperts, Swarm
from volunteer.errors import ExpertError, RemoteExpertError
from volunteer.net.multiaddr import Multiaddr
from volunteer.swarmfile import SwarmSpec

from tests.training import SumTask

from .test_hivemind_dht import hivemind_python

pytestmark = pytest.mark.interop

SERVER = Path(__file__).parent / "peers" / "hivemind_server.py"
HIDDEN = 16


class HivemindServer:
    """``hivemind_server.py`` in its own process group (synchronous: the trainer is plain PyTorch)."""

    def __init__(self, uids: list[str], *initial_peers: str) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="hm-server-")
        self.log = Path(self.tmp.name) / "stderr.log"
        with open(self.log, "wb") as err:
            self.process = subprocess.Popen(
                [str(hivemind_python()), str(SERVER), "--hidden", str(HIDDEN), "--uids", ",".join(uids), *initial_peers],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, start_new_session=True, cwd=self.tmp.name,
            )
        timer = threading.Timer(120, self.kill)  # a server that never gets ready is killed, not waited on
        timer.start()
        try:
            for raw in self.process.stdout:
                line = raw.decode().strip()
                if line.startswith("READY "):
                    self.addr = line.split()[1]
                    return
            raise RuntimeError(f"hivemind server exited: {self.log.read_text()[-3000:]}")
        finally:
            timer.cancel()

    def kill(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # p2pd and the server's processes are in the group
        except ProcessLookupError:
            pass
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            pipe.close()
        self.tmp.cleanup()


@pytest.mark.trio_timeout(300)
def test_our_mixture_trains_on_hivemind_servers_and_routes_around_a_killed_one():
    servers: list[HivemindServer] = []
    swarm = None
    try:
        servers.append(HivemindServer(["ffn.0", "ffn.1"]))
        servers.append(HivemindServer(["ffn.2", "ffn.3"], servers[0].addr))
        swarm = Swarm.join(SwarmSpec("hm", "hm", bootstrap=[Multiaddr(servers[0].addr)], kind="hivemind"), timeout=60)
        torch.manual_seed(0)
        moe = RemoteMixtureOfExperts(swarm, in_features=HIDDEN, grid_size=(4,), uid_prefix="ffn", k_best=2,
                                     forward_timeout=10, backward_timeout=10, timeout_after_k_min=1.0, refresh_period=1.0)
        for _ in range(60):  # hivemind servers declare right after they start; bounded wait
            if len(moe.live_experts(refresh=True)) == 4:
                break
        assert sorted(moe.live_experts()) == ["ffn.0", "ffn.1", "ffn.2", "ffn.3"]
        task = SumTask(moe, HIDDEN, batch=64, lr=3e-2)
        losses = task.fit(40)
        print("losses", losses[0], losses[-1])
        assert sum(losses[-5:]) < sum(losses[:5]) * 0.7, losses

        with pytest.raises(RemoteExpertError):
            RemoteExpert("ffn.0", servers[0].addr.rsplit("/p2p/", 1)[1], swarm, forward_timeout=10)(torch.zeros(2, HIDDEN + 1))

        dead = servers[1].addr.rsplit("/p2p/", 1)[1]
        servers[1].kill()
        with pytest.raises(ExpertError):  # unavailable or timed out: ours, never a hang
            RemoteExpert("ffn.2", dead, swarm, forward_timeout=10)(task.x)
        failures = moe.failures
        losses = task.fit(8)
        assert moe.failures > failures and math.isfinite(losses[-1])
    finally:
        if swarm is not None:
            swarm.close()
        for server in servers:
            server.kill()
