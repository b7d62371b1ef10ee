"""``open_volunteer`` on a swarm file of ``kind = "hivemind"``: the node joins the hivemind DHT
through the file's bootstrap peers, serves and declares its experts the hivemind way, stops
declaring while paused, and refuses to start when no bootstrap peer speaks hivemind's DHT."""

from __future__ import annotations

from contextlib import asynccontextmanager

import numpy as np
import pytest
import trio

from volunteer.cli import views
from volunteer.dht.node import DHTNode
from volunteer.experts.server import ExpertServer
from volunteer.hivemind import HivemindDHT
from volunteer.hivemind.experts import HivemindExperts
from volunteer.hivemind import expert_wire as wire
from volunteer.hivemind.rpc import call_unary
from volunteer.net.stack import StackOptions, open_stack
from volunteer.node import JoinError, VolunteerOptions, open_volunteer
from volunteer.swarmfile import SwarmSpec

def leaves(exc: BaseException) -> list[BaseException]:
    """The non-group exceptions inside ``exc`` (the Host's nursery wraps what the body raised)."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)


def options(**extra) -> VolunteerOptions:
    return VolunteerOptions(
        listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, nat=False, mdns=False, device="cpu",
        expert_class="ffn", uids=["ffn.0", "ffn.1"], hidden_dim=8, **extra,
    )


@asynccontextmanager
async def hivemind_peer():
    """A hivemind DHT member (ours: the interop tests meet the real one)."""
    dht = HivemindDHT()
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET, services=[dht]) as host:
        yield host, dht


@pytest.mark.trio_timeout(60)
async def test_join_a_hivemind_swarm_serve_declare_and_pause():
    async with hivemind_peer() as (peer, peer_dht):
        spec = SwarmSpec("hm", "hm", bootstrap=[peer.full_addrs()[0]], kind="hivemind")
        async with open_volunteer(spec, options()) as node:
            # nothing of our own protocols runs
            assert node.dht is None and node.host.service(DHTNode) is None and node.host.service(ExpertServer) is None
            experts = node.host.service(HivemindExperts)
            assert experts is not None and node.server is experts
            assert node.host.peer_id in peer_dht.core.contacts
            with trio.fail_after(20):
                while views.dht_view(node)["experts_declared"] != 2:
                    await trio.sleep(0.02)
            found = await peer_dht.get("ffn.1")
            assert found is not None and found.value == node.host.peer_id.to_base58()
            view = views.dht_view(node)
            assert view["kind"] == "hivemind" and view["requests"] is None and view["routing_table"] >= 1

            x = np.ones((2, 8), np.float32)
            data = await call_unary(peer, node.host.peer_id, wire.FORWARD, wire.request("ffn.0", [x]), timeout=10)
            assert wire.parse_response(data)[0].shape == (2, 8)
            assert views.expert_rows(node, trio.current_time())[0]["requests"] == 1

            await node.pause()
            assert await experts.declare() == 0  # paused: nothing declared, records expire
            assert views.dht_view(node)["experts_declared"] == 0
            node.resume()
            assert await experts.declare() > 0


@pytest.mark.trio_timeout(60)
async def test_a_bootstrap_peer_without_hivemind_dht_fails_the_join_clearly():
    async with open_stack(listen=["/ip4/127.0.0.1/tcp/0"], options=QUIET) as plain:
        spec = SwarmSpec("hm", "hm", bootstrap=[plain.full_addrs()[0]], kind="hivemind")
        with pytest.raises(BaseException) as caught:
            async with open_volunteer(spec, options()):
                raise AssertionError("joined a swarm whose peer speaks no hivemind")
        [error] = leaves(caught.value)
        assert isinstance(error, JoinError)
        assert "cannot join hivemind swarm 'hm'" in str(error) and "hivemind DHT ping" in str(error)
