"""``RuntimeHosting``: on a swarm without grids the one part that sets an expert aside (tombstone
first, then out of the runtime, kept) and takes it back (served and declared again)."""

from __future__ import annotations

from dataclasses import dataclass, field

from volunteer.kinds.hosting import RuntimeHosting


@dataclass
class Backend:
    uid: str


@dataclass
class Runtime:
    backends: dict = field(default_factory=lambda: {u: Backend(u) for u in ("a", "b")})
    steps: list = field(default_factory=list)

    def remove_backend(self, uid):
        self.steps.append(("remove", uid))
        return self.backends.pop(uid)

    def add_backend(self, backend):
        self.steps.append(("add", backend.uid))
        self.backends[backend.uid] = backend


@dataclass
class Declarer:
    steps: list

    def add(self, uid):
        self.steps.append(("declare", uid))

    async def drop(self, uid):
        self.steps.append(("tombstone", uid))


async def test_set_aside_tombstones_before_the_runtime_forgets_and_take_back_declares_again():
    runtime = Runtime()
    hosting = RuntimeHosting(runtime, Declarer(runtime.steps))
    kept = runtime.backends["a"]
    assert await hosting.set_aside("a") and not await hosting.set_aside("zz")
    assert runtime.steps == [("tombstone", "a"), ("remove", "a")] and hosting.hosted() == {"b"}
    assert hosting.take_back(["a", "b", "zz"]) == ["a"]  # only what was set aside comes back
    assert runtime.backends["a"] is kept and runtime.steps[-2:] == [("add", "a"), ("declare", "a")]
    assert hosting.take_back(["a"]) == []  # once


async def test_a_kind_without_a_declarer_only_takes_the_expert_out_of_the_runtime():
    runtime = Runtime()
    hosting = RuntimeHosting(runtime)  # hivemind's service declares runtime.uids each round
    assert await hosting.set_aside("b") and runtime.steps == [("remove", "b")]
    assert hosting.take_back(["b"]) == ["b"] and hosting.hosted() == {"a", "b"}
