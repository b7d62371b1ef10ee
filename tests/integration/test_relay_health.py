"""The relay's public swarm health page with real volunteers on loopback: a relay serving one
swarm's DHT and its health page, volunteers hosting a grid (one under a public name, one
without), and the page's JSON and Prometheus export read over HTTP as a scraper would."""

from __future__ import annotations

import json

import pytest
import torch
import trio

from relay.node import open_relay_node
from relay.healthservice import WatchedSwarm
from volunteer.dht import DHTConfig
from volunteer.experts import ExpertsConfig
from volunteer.dht.vouches import VouchBook, vouch_item
from volunteer.net.identity import KeyPair
from volunteer.net.stack import StackOptions
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.replicas import ReplicasConfig
from volunteer.swarmfile import GridSpec, SwarmSpec

from .test_donor_web import http

SWARM = "healthnet"
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
DHT = DHTConfig(swarm_id=SWARM, expert_update_period=600.0, expert_expiration=1200.0)
CONFIG = ReplicasConfig(sync_timeout=600.0, recheck_period=3600.0, handoff_timeout=60.0)
GRID = GridSpec("hx", (2, 2), "ffn", 8, replicas=1, sync_period=3600.0)


def options(**changes) -> VolunteerOptions:
    base = dict(listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, dht_config=DHT, nat=False, mdns=False,
                experts_config=ExpertsConfig(device="cpu"), replicas_config=CONFIG, hidden_dim=8)
    return VolunteerOptions(**{**base, **changes})


async def refreshed_until(relay, predicate) -> dict:
    """Refresh the health model (as the background task does) until ``predicate(model)``."""
    for _ in range(200):
        model = await relay.health.refresh()
        if predicate(model):
            return model
        await trio.sleep(0.05)
    raise AssertionError(f"the health model never got there: {json.dumps(model)[:3000]}")


@pytest.mark.slow
@pytest.mark.trio_timeout(90)
async def test_health_page_serves_the_grid_volunteers_and_metrics_of_a_live_swarm():
    keypair = KeyPair.generate()
    async with open_relay_node(keypair, ["/ip4/127.0.0.1/tcp/0"], swarms=[SWARM], web=("127.0.0.1", 0),
                               watched=[WatchedSwarm(SWARM, (GRID,))]) as relay:
        entry = relay.host.full_addrs()[0]
        spec = SwarmSpec(SWARM, SWARM, [], [entry], grids=[GRID])
        async with open_volunteer(spec, options(uids=["hx.0.0", "hx.0.1"], public_name="Ada's GPU")) as named, \
                open_volunteer(spec, options(uids=["hx.1.0"])) as other:
            await named.runtime.forward("hx.0.0", [torch.randn(3, 8)])  # one call served
            named.declarer.resume()  # declare the new count now, not at the next heartbeat
            # a trainer (here the other volunteer's key and DHT node) vouches for 2 of Ada's calls
            trainer = VouchBook(other.host.keypair, SWARM, other.dht.clock() - 10)
            for _ in range(2):
                trainer.accept(named.host.peer_id.to_bytes(), 3)
            expiration = other.dht.clock() + 600
            await other.dht.store_many([vouch_item(v, expiration) for v in trainer.due(other.dht.clock())])
            model = await refreshed_until(relay, lambda m: m["swarms"][0]["grids"][0]["hosted"] == 3
                                          and [c["calls"] for c in m["swarms"][0]["contributors"]["rows"]] == [2])
            port = relay.web_addr[1]

            status, headers, body = await http(port, "GET", "/api/health", host=f"health.example:{port}")
            assert status == 200 and headers["content-type"][0].startswith("application/json")
            swarm = json.loads(body)["swarms"][0]
            grid = swarm["grids"][0]
            assert (grid["covered"], grid["missing"], grid["healthy"]) == (3, 1, False)
            assert {c["uid"]: c["replicas"] for c in grid["cells"]} == {"hx.0.0": 1, "hx.0.1": 1, "hx.1.0": 1, "hx.1.1": 0}
            assert all(c["direct"] == c["replicas"] for c in grid["cells"])
            assert swarm["volunteers"]["up"] == 2 and swarm["volunteers"]["direct"] == 2
            # the contributors are who trainers vouched for (Ada, under her name), not who reports calls
            [ada] = swarm["contributors"]["rows"]
            assert (ada["name"], ada["peer"], ada["calls"], ada["samples"], ada["up"]) == \
                ("Ada's GPU", str(named.host.peer_id), 2, 6, True)
            assert swarm["entry_points"] == [{"role": "relay", "addr": str(entry), "up": True, "self": True,
                                              "last_seen_s": swarm["entry_points"][0]["last_seen_s"]}]
            # no volunteer's address is published anywhere in the model
            text = body.decode()
            assert "127.0.0.1" not in text.replace(str(entry), "")

            status, _, body = await http(port, "GET", "/metrics")
            assert status == 200
            metrics = body.decode()
            assert f'volunteer_swarm_experts{{grid="hx",status="covered",swarm="{SWARM}"}} 3.0' in metrics
            assert f'volunteer_swarm_expert_replicas{{swarm="{SWARM}",uid="hx.1.1"}} 0.0' in metrics
            assert "volunteer_relay_reservations" in metrics  # the relay's own figures too

            status, _, body = await http(port, "GET", "/")
            assert status == 200 and b"Ada&#39;s GPU" in body and b'id="map-hx"' in body

            # read-only: a change is refused before any app code runs
            status, _, _ = await http(port, "POST", "/api/health", body=b"x")
            assert status == 405
            assert model["swarms"][0]["complete"]
            assert relay.health.snapshot()["ready"] and relay.health.snapshot()["swarms"] == [SWARM]


@pytest.mark.slow
@pytest.mark.trio_timeout(60)
async def test_page_views_read_the_cached_model_and_never_look_up_the_dht(monkeypatch):
    async with open_relay_node(KeyPair.generate(), ["/ip4/127.0.0.1/tcp/0"], swarms=[SWARM], web=("127.0.0.1", 0),
                               watched=[WatchedSwarm(SWARM, (GRID,))], web_refresh=3600.0) as relay:
        model = await relay.health.refresh()
        dht = relay.dhts[SWARM]

        async def no_lookup(*args, **kwargs):
            raise AssertionError("a page view looked up the DHT")

        monkeypatch.setattr(dht, "get_many", no_lookup)
        monkeypatch.setattr(dht, "ping", no_lookup)
        port = relay.web_addr[1]
        for _ in range(20):
            status, _, body = await http(port, "GET", "/")
            assert status == 200 and b'id="map-hx"' in body
        status, _, body = await http(port, "GET", "/api/health")
        assert status == 200 and json.loads(body) == json.loads(json.dumps(model))


@pytest.mark.slow
@pytest.mark.trio_timeout(90)
async def test_the_page_pools_the_volunteers_direct_shares():
    """Issue 34: each volunteer's NAT manager counts how much of its peer traffic went direct;
    its profile carries the counts, and the page shows the swarm's shares (the relay itself, an
    entry point, is left out of every volunteer's figures)."""
    async with open_relay_node(KeyPair.generate(), ["/ip4/127.0.0.1/tcp/0"], swarms=[SWARM], web=("127.0.0.1", 0),
                               watched=[WatchedSwarm(SWARM, (GRID,))]) as relay:
        entry = relay.host.full_addrs()[0]
        spec = SwarmSpec(SWARM, SWARM, [], [entry], grids=[GRID])
        async with open_volunteer(spec, options(uids=["hx.0.0"], nat=True)) as one, \
                open_volunteer(spec, options(uids=["hx.1.0"], nat=True)) as two:
            await one.host.connect(two.host.full_addrs()[0])  # a direct session between the two
            for node in (one, two):
                node.declarer.resume()  # declare the counts now, not at the next heartbeat

            def reported(model: dict) -> bool:
                direct = model["swarms"][0]["direct"]
                if direct["reporting"] < 2:
                    for node in (one, two):
                        node.declarer.resume()
                return direct["reporting"] == 2

            model = await refreshed_until(relay, reported)
            direct = model["swarms"][0]["direct"]
            assert direct["direct_connection_share"] == 1.0 and direct["peer_sessions_direct"] == direct["peer_sessions"]
            assert direct["bytes_relayed"] == 0 and direct["direct_data_share"] in (None, 1.0)
            port = relay.web_addr[1]
            status, _, body = await http(port, "GET", "/")
            assert status == 200 and b"of connections ended direct" in body and b"100 %" in body
            status, _, body = await http(port, "GET", "/metrics")
            assert f'volunteer_swarm_direct_share{{of="connections",swarm="{SWARM}"}} 1.0' in body.decode()


@pytest.mark.slow
@pytest.mark.trio_timeout(90)
async def test_a_trainers_accepted_calls_reach_the_page_as_its_vouches():
    """A trainer (``Swarm``) calls a donor's expert; as it leaves it stores its vouch, and the
    page ranks the donor by it, and keeps it there after the trainer and the donor are gone."""
    from volunteer import RemoteExpert, Swarm

    async with open_relay_node(KeyPair.generate(), ["/ip4/127.0.0.1/tcp/0"], swarms=[SWARM], web=("127.0.0.1", 0),
                               watched=[WatchedSwarm(SWARM, (GRID,))], web_refresh=3600.0) as relay:
        entry = relay.host.full_addrs()[0]
        spec = SwarmSpec(SWARM, SWARM, [], [entry], grids=[GRID])
        async with open_volunteer(spec, options(uids=["hx.0.0"], public_name="Ada")) as donor:

            def train() -> None:  # a PyTorch loop's thread, as a trainer runs one
                with Swarm.join(spec) as swarm:
                    expert = RemoteExpert("hx.0.0", donor.host.full_addrs()[0], swarm)
                    for _ in range(2):
                        expert(torch.randn(4, 8, requires_grad=True)).sum().backward()

            await trio.to_thread.run_sync(train)
            model = await refreshed_until(relay, lambda m: m["swarms"][0]["contributors"]["rows"])
            [ada] = model["swarms"][0]["contributors"]["rows"]
            assert (ada["name"], ada["peer"], ada["calls"], ada["samples"], ada["trainers"]) == \
                ("Ada", str(donor.host.peer_id), 4, 16, 1)
        # the donor has left: it keeps its place
        [after] = (await relay.health.refresh())["swarms"][0]["contributors"]["rows"]
        assert (after["peer"], after["calls"]) == (str(donor.host.peer_id), 4)
