"""The expert server against a hostile peer built from our own modules, over TCP on loopback:
announce-and-stall (big tensors announced, one byte sent) and backward without forward. The
honest trainer dials from another loopback address and is served during and after the attack;
the server's memory stays under its configured budget, measured (its own accounting and RSS)."""

from __future__ import annotations

import os

import msgpack
import pytest
import torch
import trio

from volunteer.errors import ExpertBackwardRefusedError
from volunteer.experts import ExpertsConfig
from volunteer.experts.backend import make_backend
from volunteer.experts.runtime import open_runtime
from volunteer.experts.admission import BACKWARD_WITHOUT_FORWARD, PEER_BYTES
from volunteer.experts.client import call_expert
from volunteer.experts.protocol import Request, protocol_id
from volunteer.experts.server import ExpertServer
from volunteer.net.stack import StackOptions, open_stack
from volunteer.net.streams import BufferedStream

QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
MiB = 1024 * 1024
PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    """Resident bytes of this process, from /proc (no psutil)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


async def _host(address: str, task_status=trio.TASK_STATUS_IGNORED):
    async with open_stack(listen=[f"/ip4/{address}/tcp/0"], options=QUIET) as host:
        task_status.started(host)
        await trio.sleep_forever()


async def _settle(predicate) -> None:
    # the server's handler runs in its own tasks: let them catch up (bounded by the test's fail_after)
    while not predicate():
        await trio.sleep(0.01)


def stall_request(nbytes: int) -> bytes:
    """A forward header announcing one float32 tensor of ``nbytes`` payload bytes."""
    rows = nbytes // (8 * 4)
    header = {"t": [{"d": "float32", "s": [rows, 8], "c": "none", "n": rows * 32}], "n": rows * 32}
    return Request("forward", "expert.0", "none", header).encode()


async def test_announce_and_stall_holds_only_the_attackers_share_and_the_honest_trainer_is_served():
    config = ExpertsConfig(device="cpu")  # the defaults: 256 MiB per call, 512 MiB per peer, 1 GiB in all
    async with trio.open_nursery() as nursery:
        server_host = await nursery.start(_host, "127.0.0.1")
        attacker = await nursery.start(_host, "127.0.0.1")
        honest = await nursery.start(_host, "127.0.0.2")
        async with open_runtime([make_backend("expert.0", "ffn", 8, config=config)], config) as runtime:
            server = ExpertServer(server_host, runtime, "s", config)
            await server_host.add_service(server)
            target = server_host.full_addrs()[0]
            # One honest forward and backward first: run first in a process, the test measured
            # torch's and the runtime's first-use allocations along with the attack.
            x = torch.randn(3, 8, requires_grad=False)
            await call_expert(honest, target, "expert.0", "forward", [x], swarm_id="s")
            await call_expert(honest, target, "expert.0", "backward", [x, torch.ones(3, 8)], n_inputs=1, swarm_id="s")
            before = rss()

            streams = []
            for _ in range(4):  # four calls on one connection, each announcing the per-call maximum
                stream = BufferedStream(await attacker.new_stream(target, [protocol_id("s")]))
                await stream.send_all(stall_request(config.max_payload_bytes) + b"\x00")
                streams.append(stream)
                if len(streams) == 2:
                    await _settle(lambda: server.budget.total == 2 * config.max_payload_bytes)
            # the two beyond the attacker's share are refused BUSY at once, before any payload is read
            for stream in streams[2:]:
                reply = msgpack.unpackb(await stream.receive_length_prefixed(1 << 20))
                assert reply["ok"] is False and reply["e"]["kind"] == "busy"
            assert server.refusals[PEER_BYTES] == 2
            assert server.budget.held_by(attacker.peer_id) == config.max_request_bytes_per_peer

            # the honest trainer, from 127.0.0.2, is served while the two stalled calls hang
            out = await call_expert(honest, target, "expert.0", "forward", [x], swarm_id="s")
            grads = await call_expert(honest, target, "expert.0", "backward", [x, torch.ones(3, 8)], n_inputs=1, swarm_id="s")
            assert out[0].shape == (3, 8) and grads[0].shape == (3, 8)
            assert "/ip4/127.0.0.2/" in str(server_host.connection_to(honest.peer_id).remote_addr)
            growth = rss() - before
            # 1 GiB was announced; the server holds bytes received, not bytes announced
            assert growth < 64 * MiB, f"RSS grew by {growth / MiB:.1f} MiB during the attack"

            for stream in streams:
                await stream.stream.reset()
            await _settle(lambda: server.budget.total == 0 and server.active_requests == 0)
            out = await call_expert(honest, target, "expert.0", "forward", [x], swarm_id="s")
            assert out[0].shape == (3, 8)
        nursery.cancel_scope.cancel()


async def test_backward_without_a_forward_is_refused_and_counted():
    config = ExpertsConfig(device="cpu")
    async with trio.open_nursery() as nursery:
        server_host = await nursery.start(_host, "127.0.0.1")
        attacker = await nursery.start(_host, "127.0.0.1")
        trainer = await nursery.start(_host, "127.0.0.2")
        backend = make_backend("expert.0", "ffn", 8, config=config)
        async with open_runtime([backend], config) as runtime:
            server = ExpertServer(server_host, runtime, "s", config)
            await server_host.add_service(server)
            target = server_host.full_addrs()[0]
            x, g = torch.randn(2, 8), torch.randn(2, 8) * 1e3
            with pytest.raises(ExpertBackwardRefusedError, match="refused backward"):
                await call_expert(attacker, target, "expert.0", "backward", [x, g], n_inputs=1, swarm_id="s")
            assert backend.updates == 0 and server.refusals[BACKWARD_WITHOUT_FORWARD] == 1

            # a forward authorizes that peer, for that expert only
            await call_expert(trainer, target, "expert.0", "forward", [x], swarm_id="s")
            await call_expert(trainer, target, "expert.0", "backward", [x, g], n_inputs=1, swarm_id="s")
            assert backend.updates == 1
            # ... and not the attacker, who still has run no forward
            with pytest.raises(ExpertBackwardRefusedError):
                await call_expert(attacker, target, "expert.0", "backward", [x, g], n_inputs=1, swarm_id="s")
            assert backend.updates == 1 and server.refusals[BACKWARD_WITHOUT_FORWARD] == 2
        nursery.cancel_scope.cancel()
