"""Hand-off on a graceful leave: every expert no other live replica holds is pushed to a volunteer
with spare capacity, which then hosts it.

``plan_handoff`` is pure: given my experts and their versions, the live hosts of every uid and the
spare capacity of candidate receivers, it says which experts need a push and whom to try, best
first (most spare capacity after the experts already given to it; ties by hash, so leavers spread
over equally free receivers). The most trained experts come first: if the leave runs out of time,
what is lost is the least. ``hand_off`` runs a plan over the state-transfer protocol in push mode,
all experts in parallel, trying each expert's candidates in order, within ``handoff_timeout``
(20 s by default), and reports what it could not hand off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Mapping

import trio

from ..errors import VolunteerError, describe
from ..net.service import HostAPI
from ..net.upload import UploadMeter
from .config import DEFAULT_CONFIG, ReplicasConfig
from .placement import Hosts, tie_break
from .store import BackendStore
from .transfer import Target, push_state

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HandOff:
    """One expert to push, and the receivers to try in order."""

    uid: str
    version: int
    candidates: tuple[str, ...]


@dataclass(frozen=True)
class HandOffPlan:
    """What a leave must do: ``pushes``; ``covered`` (other live replicas hold them: nothing to
    do); ``stranded`` (no receiver has room: only the checkpoint keeps them)."""

    pushes: tuple[HandOff, ...]
    covered: tuple[str, ...]
    stranded: tuple[str, ...]


def plan_handoff(
    mine: Mapping[str, int],
    hosts: Hosts,
    spare: Mapping[str, int],
    *,
    me: str,
    max_candidates: int = DEFAULT_CONFIG.handoff_candidates,
) -> HandOffPlan:
    """Decide the hand-offs of a leave (see the module docstring). ``mine``: uid → version;
    ``hosts``: uid → {peer: version} alive now; ``spare``: candidate peer → experts it can take."""
    covered = tuple(sorted(uid for uid in mine if any(peer != me for peer in hosts.get(uid, {}))))
    alone = sorted((uid for uid in mine if uid not in covered), key=lambda uid: (-mine[uid], uid))
    room = {peer: n for peer, n in spare.items() if peer != me and n > 0}
    pushes: list[HandOff] = []
    stranded: list[str] = []
    for uid in alone:
        ranked = sorted((peer for peer, n in room.items() if n > 0), key=lambda peer: (-room[peer], tie_break(peer, uid)))
        if not ranked:
            stranded.append(uid)
            continue
        room[ranked[0]] -= 1
        pushes.append(HandOff(uid, mine[uid], tuple(ranked[: max(1, max_candidates)])))
    return HandOffPlan(tuple(pushes), covered, tuple(stranded))


@dataclass
class HandOffResult:
    """What a leave managed: ``done`` uid → (receiver, version it hosts); ``failed`` uid → why."""

    done: dict[str, tuple[str, int]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


async def hand_off(
    host: HostAPI,
    plan: HandOffPlan,
    store: BackendStore,
    *,
    swarm_id: str,
    addrs: Mapping[str, Target] | None = None,
    timeout: float | None = None,
    config: ReplicasConfig = DEFAULT_CONFIG,
    upload: UploadMeter | None = None,
) -> HandOffResult:
    """Run ``plan``: push each expert to its first candidate that takes it, all within ``timeout``
    (``handoff_timeout``). ``addrs`` maps a candidate's peer id to what to dial (a multiaddr) when
    the Host does not know it yet. Never raises for a failed push: the result says what failed."""
    result = HandOffResult()
    for uid in plan.stranded:
        result.failed[uid] = "no volunteer with spare capacity"

    async def one(push: HandOff) -> None:
        reasons: list[str] = []
        try:
            exported = await store.export_uid(push.uid)
        except VolunteerError as exc:
            result.failed[push.uid] = describe(exc)
            return
        for candidate in push.candidates:
            target = (addrs or {}).get(candidate, candidate)
            try:
                version = await push_state(host, target, exported, swarm_id=swarm_id, config=config, upload=upload)
            except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                reasons.append(f"{candidate[:16]}: {describe(exc)}")
                continue
            result.done[push.uid] = (candidate, version)
            return
        result.failed[push.uid] = "; ".join(reasons)

    with trio.move_on_after(config.handoff_timeout if timeout is None else timeout):
        async with trio.open_nursery() as nursery:
            for push in plan.pushes:
                nursery.start_soon(one, push)
    for push in plan.pushes:
        if push.uid not in result.done:
            result.failed.setdefault(push.uid, "timed out")
    if result.failed:
        log.warning("could not hand off %s", ", ".join(f"{uid} ({why})" for uid, why in sorted(result.failed.items())))
    return result


__all__ = ["HandOff", "HandOffPlan", "HandOffResult", "hand_off", "plan_handoff"]
