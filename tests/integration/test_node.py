"""open_volunteer, the composition root: a node hosts and declares its experts, pauses and resumes,
follows reachability events, leaves gracefully (tombstones before it goes), and refuses to start
with one clear error when the swarm is unreachable or the experts cannot be built."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from volunteer.dht import DHTConfig
from volunteer.cli import views
from volunteer.dht.grid import get_experts
from volunteer.experts import ExpertsConfig
from volunteer.net.events import ReachabilityChanged
from volunteer.net.stack import StackOptions
from volunteer.net.identity import KeyPair
from volunteer.net.nat.autonat import Reachability
from volunteer.node import JoinError, VolunteerOptions, open_volunteer
from volunteer.swarmfile import SwarmSpec

SWARM = "nodetest"
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
# heartbeats only at start and on resume: a heartbeat in flight during a withdraw could land after
# the tombstone, so the test waits for each one to finish instead
DHT = DHTConfig(swarm_id=SWARM, expert_update_period=600.0, expert_expiration=1200.0)
UIDS = ["ffn.0.0", "ffn.0.1"]


def options(**changes) -> VolunteerOptions:
    base = dict(listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, dht_config=DHT, nat=False, mdns=False,
                experts_config=ExpertsConfig(device="cpu"))
    return VolunteerOptions(**{**base, **changes})


def spec(*bootstrap) -> SwarmSpec:
    return SwarmSpec(SWARM, SWARM, list(bootstrap), [])


async def heartbeats(node, count: int) -> None:
    """Until the node's declarer has sent ``count`` heartbeats (it sends one at start and on resume)."""
    with trio.fail_after(10):
        while node.declarer.declarations < count:
            await trio.sleep(0.01)


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in leaves(inner)]
    return [exc]


async def test_node_hosts_declares_pauses_resumes_and_leaves_with_tombstones():
    async with open_volunteer(spec(), options()) as seed:  # a node without experts: the swarm's entry point
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(expert_class="ffn", uids=UIDS, hidden_dim=8)) as node:
            assert sorted(node.runtime.uids) == UIDS and node.device == "cpu"
            await heartbeats(node, 1)
            found = await get_experts(seed.dht, UIDS)
            assert all([d.peer for d in found[uid]] == [node.host.peer_id] for uid in UIDS)
            assert views.dht_view(node)["experts_declared"] == 2
            assert [row["uid"] for row in views.expert_rows(node, trio.current_time())] == UIDS
            assert any(row["peer_id"] == str(seed.host.peer_id) for row in views.connections_view(node.host))
            assert views.reachability_view(node) is None  # NAT traversal is off in this test

            await node.pause()
            assert node.paused and views.dht_view(node)["experts_declared"] == 0
            assert (await get_experts(seed.dht, UIDS)) == {uid: [] for uid in UIDS}
            node.resume()
            await heartbeats(node, 2)
            assert all(found for found in (await get_experts(seed.dht, UIDS)).values())

            node.leave()
            await node.wait_leave()  # returns at once: leave() was asked for
            assert node.leaving
        # the clean exit withdrew before it went: lookups no longer return the experts
        assert (await get_experts(seed.dht, UIDS)) == {uid: [] for uid in UIDS}


async def test_dht_mode_follows_reachability_events():
    async with open_volunteer(spec(), options()) as node:
        assert not node.dht.client_mode
        node.host.events.publish(ReachabilityChanged(Reachability.PRIVATE))
        await trio.testing.wait_all_tasks_blocked()
        assert node.dht.client_mode  # private: others could not route through us
        node.host.events.publish(ReachabilityChanged(Reachability.PUBLIC))
        await trio.testing.wait_all_tasks_blocked()
        assert not node.dht.client_mode


async def test_unreachable_swarm_is_one_join_error():
    nobody = f"/ip4/127.0.0.1/tcp/1/p2p/{KeyPair.generate().peer_id}"  # port 1: refused at once
    with pytest.raises(BaseException) as caught:
        async with open_volunteer(spec(nobody), options()):
            raise AssertionError("started without reaching the swarm")
    [error] = leaves(caught.value)
    assert isinstance(error, JoinError) and "cannot reach swarm 'nodetest'" in str(error)


async def test_unknown_expert_class_is_one_join_error():
    with pytest.raises(BaseException) as caught:
        async with open_volunteer(spec(), options(expert_class="no-such-class", uids=UIDS)):
            raise AssertionError("started with experts it cannot build")
    [error] = leaves(caught.value)
    assert isinstance(error, JoinError) and "cannot build experts" in str(error)


async def test_config_limits_reach_the_resource_manager_and_the_expert_server(tmp_path):
    from volunteer.swarmfile import load_limits

    path = tmp_path / "config.toml"
    path.write_text("[limits]\npeer_memory = 33554432\naddress_pending_handshakes = 4\n"
                    "max_request_bytes_per_peer = 268435456\nbackward_window = 600\n")
    limits = load_limits(path)
    chosen = options(experts_config=None, device="cpu", expert_class="ffn", uids=UIDS, hidden_dim=8, limits=limits)
    async with open_volunteer(spec(), chosen) as node:
        assert node.host.resources.limits.peer_memory == 32 * 1024 * 1024
        assert node.host.resources.limits.address_pending_handshakes == 4
        assert node.server.config.max_request_bytes_per_peer == 256 * 1024 * 1024
        assert node.server.config.backward_window == 600


def test_config_limits_are_validated_like_every_setting(tmp_path):
    from volunteer.swarmfile import SwarmFileError, load_limits

    path = tmp_path / "config.toml"
    path.write_text("[limits]\npeer_memroy = 1\n")
    with pytest.raises(SwarmFileError, match=r"unknown setting limits.peer_memroy \(did you mean limits.peer_memory\?"):
        load_limits(path)
    path.write_text('[limits]\npeer_memory = "lots"\n')
    with pytest.raises(SwarmFileError, match="limits.peer_memory has the wrong type"):
        load_limits(path)
