"""The simulator behind ``benchmarks/scale.py`` in the shape ``benchmarks/scale_processes.py``
holds beside real processes: a loopback wire, crashes of a process whose machine lives on, one
expert per grid cell. Virtual time only (seeded, no trio, no wall clock)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from benchmarks._netsim import LOOPBACK_ONE_WAY, REGION_SHARE, REGIONS, Net, SimNode, spread_regions
from benchmarks.scale import CONFIG, steady, steady_lines
from volunteer.dht.messages import Ping
from volunteer.net.identity import KeyPair


def test_the_loopback_wire_loses_nothing_and_takes_about_a_millisecond():
    net = Net(CONFIG, seed=3, loss=0.5, wire="loopback")
    a, b = SimNode(net, KeyPair.generate()), SimNode(net, KeyPair.generate())
    delays = [net.delay(a, b) for _ in range(200)]
    assert max(delays) <= 2 * LOOPBACK_ONE_WAY and min(delays) > 0
    with pytest.raises(ValueError):
        Net(CONFIG, seed=3, wire="carrier pigeon")


@pytest.mark.parametrize("silent", [True, False])
def test_a_killed_process_on_a_live_machine_fails_requests_at_once(silent):
    net = Net(CONFIG, seed=4, wire="loopback")
    a, b = SimNode(net, KeyPair.generate()), SimNode(net, KeyPair.generate())
    b.crash(silent=silent)
    failed_at = []
    net.request(a, b.contact, Ping(), lambda response: None, lambda: failed_at.append(net.now))
    net.run_until(2 * CONFIG.request_timeout)
    assert len(failed_at) == 1
    # a silent crash runs the request out; a reset connection fails it within a round trip
    assert failed_at[0] == CONFIG.request_timeout if silent else failed_at[0] <= 4 * LOOPBACK_ONE_WAY


def test_a_small_loopback_swarm_finds_every_live_host_and_sees_crashes_and_joiners():
    out = steady(6, 1, 0.0, 1.0, 1, 0.0, grid=(2, 2), probes=2, wire="loopback", relays=1,
                 client_trainers=True, one_per_cell=True, silent_crashes=False)
    results = out["results"]
    for kind in ("expert", "grid", "beam"):
        assert results[kind] and all(found for _, found in results[kind]), kind
    # every crashed probe's declarations are gone within one expiration and a poll, and every
    # joiner (taking the crashed one's uid) is found
    assert len(results["vanish"]) == 2 and max(results["vanish"]) <= CONFIG.expert_expiration + 1.5
    assert len(results["appear"]) == 2
    # until then trainers were still told of them (polls before the expiration), never after it
    assert results["stale"] and max(results["stale"]) <= CONFIG.expert_expiration
    lines = steady_lines(out, "sim lo")
    assert len(lines) == 7 and all(line.startswith("sim lo ") for line in lines)


def test_a_heartbeat_reaches_the_tables_closest_peers_while_its_lookup_waits_on_dead_ones():
    """As storing.py's store_many: the closest peers the table knows get the records at once.
    The simulator used to store only when the key's lookup ended, and a lookup that waited on
    crashed contacts let a host's records expire at every live holder (the ten-server censor
    scenario's misses)."""
    from volunteer.dht.grid import expert_key

    net = Net(CONFIG, seed=5, wire="loopback")
    host = SimNode(net, KeyPair.generate())
    live = [SimNode(net, KeyPair.generate()) for _ in range(3)]
    dead = [SimNode(net, KeyPair.generate()) for _ in range(CONFIG.expert_replicas - 3)]
    for node in live + dead:
        host.state.table.update(node.contact, 0.0, answered=True)
    for node in dead:
        node.crash()
    host.declare(["ffn.0.0"])
    net.run_until(0.1)
    key = expert_key("ffn.0.0")
    assert all(node.state.storage.get(key, net.now) for node in live)
    net.run_until(CONFIG.request_timeout + 1.0)
    assert key not in host._closest or not any(c.peer in {d.peer for d in dead} for c in host._closest[key][1])


@pytest.mark.parametrize("n", [1, 3, 10, 37])
def test_trainers_regions_hold_each_regions_share_to_one_and_each_draw_keeps_its_odds(n):
    rng = random.Random(5)
    positions = Counter()
    for _ in range(4000):
        regions = spread_regions(n, rng)
        counts = Counter(regions)
        for region, share in zip(REGIONS, REGION_SHARE):
            assert abs(counts[region] - n * share) < 1  # never none of the big regions, nor seven of ten
        positions[regions[0]] += 1
    for region, share in zip(REGIONS, REGION_SHARE):  # the first trainer's region: as likely as a peer's
        assert abs(positions[region] / 4000 - share) < 0.03
