"""``NodeControl``: what the donor layer needs of a running node, declared here by the consumer
(as go-yamux's session declares the ``MemoryManager`` it needs and the resource manager
satisfies it).

The steward drives a node only through this protocol; ``volunteer.node.VolunteerNode``
implements it, each verb through the part of the node that owns the fact (what a node hosts is
decided by its kind's ``Hosting``: the replica manager on a swarm with grids). The donor layer
therefore imports nothing of the node, the DHT, the experts or the replicas, and its tests drive
a fake (``tests/unit/test_donor_control.py``).

Where a swarm kind cannot tell (hivemind's has no declarer to look ourselves up by, nor a DHT
of ours to re-dial), the verb answers ``None``: "cannot tell", never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable


class Finished(Protocol):
    """What a finish did: calls drained in time, sole copies handed off (and those that could
    not be: their checkpoints keep them), checkpoints saved."""

    @property
    def drained(self) -> bool: ...

    @property
    def handed_off(self) -> int: ...

    @property
    def kept(self) -> int: ...

    @property
    def saved(self) -> int: ...


@runtime_checkable
class NodeControl(Protocol):
    """A running volunteer node as the donor layer sees it."""

    # --- read-only facts -----------------------------------------------------------------------------
    @property
    def paused(self) -> bool:
        """Whether the node refuses calls and has withdrawn its experts now."""
        ...

    @property
    def entry_points(self) -> int:
        """How many bootstrap peers and relays ``redial`` dials (0: the first node of a new
        swarm, with no one to be cut off from, or a kind that cannot re-dial)."""
        ...

    @property
    def heartbeat_period(self) -> float | None:
        """Seconds between declarations of our experts; None where the kind cannot tell whether
        they are visible (no visibility watch then)."""
        ...

    def connected_peers(self) -> int:
        """Distinct peers the node is connected to now."""
        ...

    def hosted(self) -> frozenset[str]:
        """The uids of the experts served now (set-aside ones excluded)."""
        ...

    # --- the donor's verbs ---------------------------------------------------------------------------
    async def pause(self, *, quiet: bool = False) -> None:
        """Withdraw every expert and refuse calls; keep identity and connections. ``quiet``: the
        caller logs its own notice."""
        ...

    def resume(self, *, quiet: bool = False) -> None:
        """Take calls and declare the experts again."""
        ...

    async def hand_off(self) -> tuple[int, int] | None:
        """Hand off the experts no other live replica holds: (handed off, could not be), or
        None where the swarm has no replicas to hand off to."""
        ...

    async def finish(self, deadline: float) -> Finished:
        """Drain in-flight calls (at most ``deadline`` seconds), hand off sole copies, save
        checkpoints; the node stays in the swarm, paused, until it is resumed."""
        ...

    async def set_aside(self, uid: str) -> bool:
        """Withdraw one expert (tombstone, then refuse its calls) and keep it to take back;
        False when it is not hosted."""
        ...

    def take_back(self, uids: Sequence[str]) -> list[str]:
        """Serve and declare again those of ``uids`` set aside; returns those taken back."""
        ...

    # --- self-care -----------------------------------------------------------------------------------
    async def visible(self) -> bool | None:
        """Whether the peers closest to one of our expert keys hold our record; None when there
        is nothing to look up yet (nothing declared) or the kind cannot tell."""
        ...

    async def redial(self) -> int | None:
        """Re-dial the swarm's bootstrap peers and relays and bootstrap again; how many answered
        (None where the kind cannot re-dial)."""
        ...

    async def rejoin(self) -> int | None:
        """``redial``, then declare at once (not a heartbeat later); None as ``redial``."""
        ...


__all__ = ["Finished", "NodeControl"]
