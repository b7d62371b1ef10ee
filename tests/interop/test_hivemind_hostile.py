"""An unmodified hivemind 1.1.12 trainer (its own venv, its own p2pd) trains against our node while
hostile peers built from our own modules attack the node's hivemind door, dialling from other
loopback addresses: held DHT and expert requests, msgpack bombs, sub-key floods and a trickled
call, renewed for as long as the trainer runs. hivemind's own client code is served (its loss
falls, backward reaches our runtime) and the node's resident memory grows by less than 256 MiB.
"""

from __future__ import annotations

import pytest
import trio

from volunteer.hivemind import expert_wire as wire
from volunteer.hivemind.dht_protocol import STORE
from volunteer.hivemind.framing import UnaryCall, encode_call, new_call_id
from volunteer.net.stack import open_stack
from volunteer.net.resources import ResourceManager
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.swarmfile import load_swarm_file

from ..hivemind_attacks import PEER_ERRORS, flood, held_unary, map_bomb, reset_all, store_request, try_call
from ..memwatch import MiB, PeakGrowth
from .test_hivemind_dht import QUIET
from .test_hivemind_experts import GRID, HIDDEN, run_trainer

pytestmark = pytest.mark.interop

BOUND = 256 * MiB
ROUNDS = 40  # attack rounds at most (each renews what the node's timeouts dropped)


async def _attacker(address: str, *, task_status=trio.TASK_STATUS_IGNORED):
    async with open_stack(listen=[f"/ip4/{address}/tcp/0"], options=QUIET) as host:
        task_status.started(host)
        await trio.sleep_forever()


async def attack(attacker, target, done: trio.Event) -> None:
    """Renew every attack on the door each round until ``done`` (or ``ROUNDS``)."""
    trickled = None
    for round_ in range(ROUNDS):
        if done.is_set():
            return
        # enough to fill the address's shares each round, no more: this is about memory, and
        # the machine's few cores are shared with the trainer
        held = await held_unary(attacker, target, STORE, (1 << 20) - 64, 10)
        held += await held_unary(attacker, target, wire.FORWARD, 4 << 20, 20)
        for bomb in (map_bomb(1 << 20), map_bomb(1 << 20, 4000)):
            await try_call(attacker, target, STORE, store_request(f"bomb.{round_}", b"", bomb))
        if round_ < 3:
            await flood(attacker, target, f"flood.{round_}", 4000, 48)
        if trickled is None:  # a call sent a byte a second, until the node drops it
            trickled = await attacker.new_stream(target, [wire.FORWARD])
            await trickled.send_all(encode_call(UnaryCall(new_call_id(), wire.FORWARD, bytes(1 << 20)))[:4096])
        else:
            try:
                await trickled.send_all(b"\0")
            except PEER_ERRORS:
                trickled = None
        with trio.move_on_after(3):
            await done.wait()
        await reset_all(held)


@pytest.mark.slow
@pytest.mark.trio_timeout(400)
async def test_an_unmodified_hivemind_trainer_is_served_while_the_door_is_attacked(tmp_path):
    swarm_file = tmp_path / "hm.toml"
    swarm_file.write_text('name = "hm"\nkind = "hivemind"\n[experts]\nexperts = "ffn:ffn.[0:4]"\n')
    options = VolunteerOptions(
        listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, nat=False, mdns=False, device="cpu",
        expert_class="ffn", uids=[f"ffn.{i}" for i in range(GRID)], hidden_dim=HIDDEN,
    )
    async with open_volunteer(load_swarm_file(swarm_file), options) as node:
        target = node.host.full_addrs()[0]
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            watch = PeakGrowth.watching(nursery)
            for address in ("127.0.0.2", "127.0.0.3"):
                attacker = await nursery.start(_attacker, address)
                await attacker.connect(target)
                nursery.start_soon(attack, attacker, node.host.peer_id, done)
            try:
                result = await run_trainer(
                    str(target), "--hidden", str(HIDDEN), "--grid", str(GRID), "--steps", "60", timeout=300
                )
            finally:
                done.set()
            nursery.cancel_scope.cancel()
        print("hivemind trainer under attack:", result, "growth:", watch.mib)
        assert watch.growth < BOUND, f"grew by {watch.mib} while attacked"
        assert result["last"] < result["first"], result
        assert result["after_error_shape"] == [3, HIDDEN]
        assert sum(backend.updates for backend in node.runtime.backends.values()) >= 60
        refused = node.host.service(ResourceManager).refusals()
        assert refused.get("hivemind-dht-peer", {}).get("memory", 0) > 0
        assert refused.get("hivemind-experts-peer", {}).get("memory", 0) > 0
