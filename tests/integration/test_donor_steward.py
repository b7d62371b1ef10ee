"""The Steward on real nodes over loopback: a run-when verdict withdraws and re-declares the
experts, an expert that keeps failing is set aside (and the daemon holds itself back once all
are), a finish drains and saves, and a volunteer whose records vanished from the DHT (its
bootstrap peer restarted empty) re-joins by itself."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import trio

from volunteer.donor.fold import Conduct
from volunteer.donor.policy import settings_from
from volunteer.donor.steward import Steward, TrafficMeter
from volunteer.dht import DHTConfig
from volunteer.dht.grid import get_experts
from volunteer.experts import ExpertsConfig
from volunteer.net.stack import StackOptions
from volunteer.node import VolunteerOptions, open_volunteer
from volunteer.swarmfile import SwarmSpec

SWARM = "stewardtest"
QUIET = StackOptions(perf=None, relay_client=False, hole_punching=False)
UIDS = ["ffn.0.0", "ffn.0.1"]


@dataclass
class Machine:
    """A machine a test describes (the SystemProbe seam)."""

    battery: bool | None = None
    load: float | None = None
    running: set[str] = field(default_factory=set)
    wall: float = 1_900_000_000.0

    def now(self) -> float:
        return self.wall

    def on_battery(self):
        return self.battery

    def cpu(self):
        return None

    def other_load(self):
        return self.load

    def programs(self):
        return frozenset(self.running)

    def input_idle_s(self):
        return None


def options(period: float = 600.0, **changes) -> VolunteerOptions:
    dht = DHTConfig(swarm_id=SWARM, expert_update_period=period, expert_expiration=max(3 * period, 3.0))
    base = dict(listen=["/ip4/127.0.0.1/tcp/0"], stack=QUIET, dht_config=dht, nat=False, mdns=False,
                experts_config=ExpertsConfig(device="cpu"))
    return VolunteerOptions(**{**base, **changes})


def spec(*bootstrap) -> SwarmSpec:
    return SwarmSpec(SWARM, SWARM, list(bootstrap), [])


async def until(condition, timeout: float = 15.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.02)


async def declared(dht, uids=UIDS) -> bool:
    return all((await get_experts(dht, uids)).values())


async def test_policy_verdicts_withdraw_and_redeclare(tmp_path):
    machine = Machine(battery=False)
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(expert_class="ffn", uids=UIDS, hidden_dim=8)) as node:
            conduct = Conduct(now=machine.now())
            steward = Steward(conduct, settings_from({"pause_programs": ["steam"], "max_other_load": 50}), machine, period=0.02)
            async with trio.open_nursery() as nursery:
                await nursery.start(steward.run, node)
                await until(lambda: node.declarer.declarations >= 1)
                assert await declared(seed.dht)
                for change, text in ((dict(battery=True), "paused: on battery"),
                                     (dict(battery=False, running={"steam"}), "paused: steam is running"),
                                     (dict(running=set(), load=90.0), "paused: other programs use 90 % CPU (limit 50 %)")):
                    for key, value in change.items():
                        setattr(machine, key, value)
                    await until(lambda: conduct.text == text and node.paused)
                    assert not await declared(seed.dht) and (await get_experts(seed.dht, UIDS)) == {u: [] for u in UIDS}
                machine.load = 5.0
                await until(lambda: conduct.serving and not node.paused)
                await until(lambda: node.declarer.declarations >= 2)
                assert await declared(seed.dht)
                events = [(e.action, e.origin, e.reason) for e in conduct.events]
                assert ("paused", "policy", "on battery") in events and events[-1][:2] == ("resume", "policy")
                snap = steward.snapshot()
                assert snap["policy"]["verdict"]["state"] == "running" and snap["policy"]["observed"]["other_load"] == 5.0
                nursery.cancel_scope.cancel()


async def test_an_expert_that_keeps_failing_is_set_aside_and_fold_takes_it_back(tmp_path):
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        conduct = Conduct(now=0)
        steward = Steward(conduct, settings_from({}), None, failure_limit=3)
        opts = options(expert_class="ffn", uids=UIDS, hidden_dim=8, on_outcome=steward.outcome)
        async with open_volunteer(spec(entry), opts) as node:
            async with trio.open_nursery() as nursery:
                await nursery.start(steward.run, node)
                await until(lambda: node.declarer.declarations >= 1)
                outcome = node.server.on_outcome  # what the expert server calls after each call
                outcome("ffn.0.0", "RuntimeError: boom")
                outcome("ffn.0.0", None)  # a success starts the count over
                for _ in range(3):
                    outcome("ffn.0.0", "RuntimeError: boom")
                await until(lambda: "ffn.0.0" not in node.runtime.backends)
                assert node.declarer.uids == ["ffn.0.1"] and conduct.serving
                assert (await get_experts(seed.dht, ["ffn.0.0"])) == {"ffn.0.0": []}
                assert "failed 3 calls in a row" in steward.snapshot()["self_care"]["set_aside"]["ffn.0.0"]
                for _ in range(3):
                    outcome("ffn.0.1", "RuntimeError: boom")
                await until(lambda: not conduct.serving and node.paused)
                assert conduct.text.startswith("paused: all 2 expert(s) failed 3 calls in a row")
                await steward.ask("fold", "cli")
                assert sorted(node.runtime.backends) == UIDS and sorted(node.declarer.uids) == UIDS
                assert conduct.serving and not node.paused
                nursery.cancel_scope.cancel()


async def test_finish_drains_saves_and_stays_connected(tmp_path):
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        opts = options(expert_class="ffn", uids=UIDS, hidden_dim=8, checkpoint_dir=tmp_path / "ckpt")
        async with open_volunteer(spec(entry), opts) as node:
            conduct = Conduct(now=0)
            steward = Steward(conduct, settings_from({}), None)
            async with trio.open_nursery() as nursery:
                await nursery.start(steward.run, node)
                reply = await steward.ask("finish", "web")
                assert reply["state"] in ("finishing", "finished") and node.paused
                await until(lambda: conduct.state == "finished")
                assert sorted(p.name for p in (tmp_path / "ckpt").iterdir() if p.suffix == ".pt") == [f"{u}.pt" for u in UIDS]
                assert node.host.is_connected(seed.host.peer_id)  # idle, but still in the swarm
                assert [e.action for e in conduct.events][-2:] == ["finish", "finished"]
                await steward.ask("fold", "web")
                assert conduct.serving and not node.paused
                nursery.cancel_scope.cancel()


async def test_a_volunteer_whose_records_others_lost_rejoins_and_says_so(monkeypatch, caplog):
    """Our records vanish from the peers that should hold them (here: the seed stops returning
    them, as a restarted or overloaded peer would) while we believe we serve: within two
    heartbeats self-care re-dials the swarm's entry points, bootstraps the DHT again, declares
    at once, and says so; once the records are back, the watch sees us again."""
    async with open_volunteer(spec(), options()) as seed:
        entry = seed.host.full_addrs()[0]
        async with open_volunteer(spec(entry), options(period=0.3, expert_class="ffn", uids=UIDS, hidden_dim=8)) as node:
            steward = Steward(Conduct(now=0), settings_from({}), None)
            async with trio.open_nursery() as nursery:
                await nursery.start(steward.run, node)
                await until(lambda: steward.visibility.visible is True)
                storage = seed.dht.state.storage
                real_get = storage.get
                ours = node.host.peer_id.to_bytes()
                monkeypatch.setattr(storage, "get", lambda key, now: {k: r for k, r in real_get(key, now).items() if k != ours})
                bootstrapped = node.dht.last_bootstrap_ok
                await until(lambda: steward.visibility.rejoins >= 1, timeout=30)
                await until(lambda: node.dht.last_bootstrap_ok != bootstrapped)  # it re-dialled and bootstrapped again
                assert any("not been visible in the DHT for 2 heartbeats: re-joining" in r.getMessage() for r in caplog.records)
                monkeypatch.setattr(storage, "get", real_get)
                await until(lambda: steward.visibility.visible is True, timeout=30)
                assert steward.snapshot()["self_care"]["visibility"]["rejoins"] >= 1
                nursery.cancel_scope.cancel()


def test_traffic_meter_counts_growth_per_connection():
    class Conn:
        def __init__(self, sent, received):
            self.bytes_sent, self.bytes_received = sent, received

    meter = TrafficMeter()
    a, b = Conn(100, 50), Conn(10, 0)
    assert meter.step([a, b]) == 160
    a.bytes_sent += 40
    assert meter.step([a]) == 40  # b closed: gone from the count, nothing negative
    c = Conn(5, 5)
    assert meter.step([a, c]) == 10


@pytest.mark.slow
@pytest.mark.trio_timeout(60)
async def test_a_volunteer_cut_off_from_the_swarm_says_so_redials_and_sees_it_come_back(caplog):
    """Its only entry point goes away: after the grace it says "cut off from the swarm since …"
    (log, status text, snapshot) and re-dials the entry point every period; once the entry point
    is back at its address, a re-dial reaches it and the daemon says it is back in touch."""
    import logging
    import socket

    caplog.set_level(logging.INFO)  # being back is a notice; being cut off, a warning

    from volunteer.donor.selfcare import SwarmContact
    from volunteer.net.identity import KeyPair

    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    seed_key = KeyPair.generate()
    seed_options = options(keypair=seed_key, listen=[f"/ip4/127.0.0.1/tcp/{port}"])
    entry = f"/ip4/127.0.0.1/tcp/{port}/p2p/{seed_key.peer_id}"

    async def run_seed(stop: trio.Event, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with open_volunteer(spec(), seed_options):
            task_status.started()
            await stop.wait()

    async with trio.open_nursery() as seeds:
        gone = trio.Event()
        await seeds.start(run_seed, gone)
        async with open_volunteer(spec(entry), options()) as node:
            contact = SwarmContact(grace=0.5, redial_period=0.5)
            steward = Steward(Conduct(now=0), settings_from({}), None, contact=contact, contact_period=0.1)
            async with trio.open_nursery() as nursery:
                await nursery.start(steward.run, node)
                await trio.sleep(0.5)
                assert not contact.view(0)["cut_off"] and steward.state_text() == steward.conduct.text
                gone.set()  # the swarm's only entry point is gone
                await until(lambda: contact.redials >= 2)
                assert steward.state_text().startswith(f"{steward.conduct.text}; cut off from the swarm since ")
                assert "re-dialling its bootstrap peers and relays every 0.5 s" in steward.state_text()
                assert steward.snapshot()["self_care"]["contact"]["cut_off"] is True
                assert any(r.getMessage().startswith("cut off from the swarm since") for r in caplog.records)
                await seeds.start(run_seed, trio.Event())  # back at its address
                await until(lambda: not contact.view(0)["cut_off"], timeout=30)
                assert any("back in touch with the swarm" in r.getMessage() for r in caplog.records)
                assert steward.state_text() == steward.conduct.text
                nursery.cancel_scope.cancel()
        seeds.cancel_scope.cancel()
