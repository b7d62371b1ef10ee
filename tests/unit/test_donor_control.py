"""The donor layer against a fake ``NodeControl`` (no network, no torch): fold / pause / finish,
the run-when policy, set-aside and take-back, a pause that lasts, the visibility and contact
watches each drive the fake, and the tests assert what it was asked."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
import trio

from volunteer.donor.control import NodeControl
from volunteer.donor.fold import LONG_PAUSE, Conduct
from volunteer.donor.policy import settings_from
from volunteer.donor.selfcare import SwarmContact
from volunteer.donor.steward import FINISH_DEADLINE, Steward

UIDS = ("ffn.0.0", "ffn.0.1")


@dataclass(frozen=True)
class Done:
    drained: bool = True
    handed_off: int = 1
    kept: int = 0
    saved: int = 2


@dataclass
class FakeNode:
    """A node as the donor layer sees it: it records what it is asked and answers as told."""

    hosting: set[str] = field(default_factory=lambda: set(UIDS))
    entry_points: int = 2
    heartbeat_period: float | None = None  # None: a kind that cannot tell (no visibility watch)
    seen: list[bool | None] = field(default_factory=list)  # what visible() answers, in turn
    peers: int = 3
    paused: bool = False
    asked: list[tuple] = field(default_factory=list)
    aside: set[str] = field(default_factory=set)

    def connected_peers(self) -> int:
        return self.peers

    def hosted(self) -> frozenset[str]:
        return frozenset(self.hosting)

    async def pause(self, *, quiet: bool = False) -> None:
        self.asked.append(("pause",))
        self.paused = True

    def resume(self, *, quiet: bool = False) -> None:
        self.asked.append(("resume",))
        self.paused = False

    async def hand_off(self) -> tuple[int, int] | None:
        self.asked.append(("hand_off",))
        return (1, 0)

    async def finish(self, deadline: float) -> Done:
        self.asked.append(("finish", deadline))
        return Done()

    async def set_aside(self, uid: str) -> bool:
        self.asked.append(("set_aside", uid))
        if uid not in self.hosting:
            return False
        self.hosting.discard(uid)
        self.aside.add(uid)
        return True

    def take_back(self, uids: Sequence[str]) -> list[str]:
        self.asked.append(("take_back", tuple(sorted(uids))))
        back = [uid for uid in uids if uid in self.aside]
        self.aside -= set(back)
        self.hosting |= set(back)
        return back

    async def visible(self) -> bool | None:
        self.asked.append(("visible",))
        return self.seen.pop(0) if self.seen else True

    async def redial(self) -> int | None:
        self.asked.append(("redial",))
        return self.entry_points

    async def rejoin(self) -> int | None:
        self.asked.append(("rejoin",))
        return self.entry_points

    def verbs(self) -> list[str]:
        return [ask[0] for ask in self.asked]


@dataclass
class Machine:
    """The SystemProbe seam: a machine on battery or not, on a clock the test moves."""

    battery: bool | None = False
    wall: float = 1_900_000_000.0

    def now(self) -> float:
        return self.wall

    def on_battery(self) -> bool | None:
        return self.battery

    def cpu(self) -> None:
        return None

    def other_load(self) -> float | None:
        return None

    def programs(self) -> frozenset[str]:
        return frozenset()

    def input_idle_s(self) -> float | None:
        return None

    def gpu_users(self) -> None:
        return None


async def until(condition, timeout: float = 60.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.01)


def test_the_fake_and_the_node_both_satisfy_the_protocol():
    from volunteer.node import VolunteerNode

    assert isinstance(FakeNode(), NodeControl)
    members = {name for name in dir(NodeControl) if not name.startswith("_")}
    assert members >= {"pause", "resume", "finish", "set_aside", "take_back", "visible", "rejoin"}
    missing = sorted(name for name in members if not hasattr(VolunteerNode, name))
    assert missing == []


async def test_pause_and_fold_from_the_donor_pause_and_resume_the_node():
    node = FakeNode()
    steward = Steward(Conduct(now=0), settings_from({}), None)
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)
        reply = await steward.ask("pause", "cli")
        assert reply["paused"] and reply["state"] == "paused" and node.verbs() == ["pause"]
        reply = await steward.ask("fold", "web")
        assert not reply["paused"] and node.verbs() == ["pause", "take_back", "resume"]
        nursery.cancel_scope.cancel()


async def test_a_start_without_consent_never_serves():
    node = FakeNode()
    steward = Steward(Conduct(folding=False), settings_from({}), None)  # paused since now (the wall clock)
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)  # the first reconcile happens before started()
        assert node.paused and node.verbs() == ["pause"]
        nursery.cancel_scope.cancel()


async def test_finish_asks_the_node_to_finish_within_the_deadline_and_says_what_it_saved():
    node = FakeNode()
    conduct = Conduct(now=0)
    kept: list[str] = []
    steward = Steward(conduct, settings_from({}), None, on_choice=lambda c: kept.append(c.state))
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)
        await steward.ask("finish", "web")
        await until(lambda: conduct.state == "finished")
        assert node.asked[:2] == [("pause",), ("finish", FINISH_DEADLINE)]
        assert "checkpoints saved (2 experts)" in conduct.events[-1].line
        assert kept[-1] == "finished"
        nursery.cancel_scope.cancel()


async def test_policy_verdicts_pause_and_resume_the_node(autojump_clock):
    node, machine = FakeNode(), Machine(battery=True)
    conduct = Conduct(now=machine.now())
    steward = Steward(conduct, settings_from({}), machine, period=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)
        assert node.verbs() == ["pause"] and conduct.text == "paused: on battery"  # before anything served
        machine.battery = False
        await until(lambda: not node.paused)
        assert node.verbs() == ["pause", "resume"] and conduct.serving
        nursery.cancel_scope.cancel()


async def test_a_pause_that_lasts_hands_off_once(autojump_clock):
    node, machine = FakeNode(), Machine()
    conduct = Conduct(now=machine.now())
    steward = Steward(conduct, settings_from({}), machine, period=1.0)
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)
        await steward.ask("pause", "cli")
        assert "hand_off" not in node.verbs()
        machine.wall += LONG_PAUSE + 1
        await until(lambda: "hand_off" in node.verbs())
        machine.wall += LONG_PAUSE
        await trio.sleep(5)
        assert node.verbs().count("hand_off") == 1 and conduct.handed_off
        nursery.cancel_scope.cancel()


async def test_an_expert_that_keeps_failing_is_set_aside_by_the_node_and_fold_takes_it_back():
    node = FakeNode()
    conduct = Conduct(now=0)
    steward = Steward(conduct, settings_from({}), None, failure_limit=2)
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)
        for _ in range(2):
            steward.outcome("ffn.0.0", "RuntimeError: boom")
        await until(lambda: ("set_aside", "ffn.0.0") in node.asked)
        assert conduct.serving and node.hosted() == {"ffn.0.1"}
        for _ in range(2):
            steward.outcome("ffn.0.1", "RuntimeError: boom")
        await until(lambda: node.paused)  # every expert set aside: the daemon holds itself back
        assert conduct.text.startswith("paused: all 2 expert(s) failed 2 calls in a row")
        await steward.ask("fold", "cli")
        assert ("take_back", UIDS) in node.asked and node.hosted() == set(UIDS) and not node.paused
        assert steward.snapshot()["self_care"]["set_aside"] == {}
        nursery.cancel_scope.cancel()


async def test_two_missed_heartbeats_rejoin_and_a_kind_that_cannot_tell_is_not_watched(autojump_clock):
    node = FakeNode(heartbeat_period=10.0, seen=[None, True, False, False])
    steward = Steward(Conduct(now=0), settings_from({}), None)
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)
        await until(lambda: "rejoin" in node.verbs())
        assert node.verbs().count("visible") == 4 and steward.visibility.rejoins == 1
        nursery.cancel_scope.cancel()

    blind = FakeNode(heartbeat_period=None, seen=[False] * 5)
    steward = Steward(Conduct(now=0), settings_from({}), None)
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, blind)
        await trio.sleep(50)  # five heartbeats of the first node
        assert "visible" not in blind.verbs() and "rejoin" not in blind.verbs()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("entry_points, redials", [(2, True), (0, False)])
async def test_cut_off_from_every_peer_redials_unless_there_is_no_one_to_dial(autojump_clock, entry_points, redials):
    node = FakeNode(peers=0, entry_points=entry_points)
    # no grace: the first look with no peer is a cut-off (the wall clock stands still here)
    steward = Steward(Conduct(now=0), settings_from({}), None, contact_period=1.0, contact=SwarmContact(grace=0.0))
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)
        await trio.sleep(60)
        assert ("redial" in node.verbs()) is redials
        assert steward.contact.view(0)["cut_off"] is redials
        nursery.cancel_scope.cancel()


async def test_the_transfer_cap_pauses_before_the_next_period_would_cross_it(autojump_clock):
    # 100 bytes a second against a 1000-byte cap, looked at every second: the pause comes before
    # the cap is reached (the next second would cross it), not after it was overshot.
    class Streaming(Machine):
        def now(self) -> float:
            return self.wall + trio.current_time()

    node, machine = FakeNode(), Streaming()
    start = trio.current_time()
    conduct = Conduct(now=machine.now())
    steward = Steward(conduct, settings_from({"daily_transfer": 1000}), machine, period=1.0,
                      transferred_today=lambda now: int(100 * (trio.current_time() - start)))
    async with trio.open_nursery() as nursery:
        await nursery.start(steward.run, node)
        await until(lambda: node.paused, timeout=30)
        assert 100 * (trio.current_time() - start) < 1000
        assert conduct.verdict.code == "transfer" and "before the next look" in conduct.verdict.reason
        nursery.cancel_scope.cancel()
