"""The catch-up race: fetch an expert's state from its live replicas until one can be believed.

Sources come ordered (``placement.catch_up_order``: freshest first, suspect version claims in a
second phase, tried only if no source of the first delivered a state: a suspect claim can
neither win against a believable source nor veto it). ``catch_up_parallel`` are fetched at a time,
each paced (a stalled or silent source is dropped within seconds, ``transfer.fetch_state``), and a
source that refuses or fails costs only itself. Every fetched state must be plausible (finite, at
a trained scale: ``state.check_plausible``). With two or more sources in a phase, every one of
them is fetched (up to ``MAX_COMPARED`` plausible states) and compared (``corroborate.py``):

- identities are free, so agreement is not a vote. Two sybils serving the same lie agree with
  each other as well as two honest replicas do; what they cannot do is agree with the honest
  state. A state is loaded only when **no delivered state contradicts it**: all that arrived
  agree (the freshest of them is loaded, corroborated by another), or the sole state delivered;
- a contradiction is a standoff unless standing settles it: when the states we already proved
  (sources we caught up from or merged with before: ``proven``) all fall on one side, that side
  is loaded. Fresh identities prove nothing, so a standoff between strangers loads nothing, and
  the joiner hosts something else or tries again at its next re-check.

So a group of colluding fresh identities can keep a joiner from loading an expert they dispute,
never make it load their state while an honest replica answers.

What the race saw comes back as a ``CatchUpResult`` (who served what, who was refused and why);
the manager imports the winner and records standings and refusals.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Collection, Sequence

import trio

from ..errors import VolunteerError, describe
from ..experts.backend import ExpertBackend
from ..net.identity import PeerID
from ..net.service import HostAPI
from .config import ReplicasConfig
from .corroborate import Evidence, agree, evidence_of, probe_inputs
from .errors import ImplausibleStateError
from .messages import StateHeader
from .state import check_plausible
from .transfer import fetch_state, request_for

log = logging.getLogger(__name__)

MAX_COMPARED = 4  # plausible states held for comparison at once: a standoff past this is given up


@dataclass
class Fetched:
    """A plausible state one source served, and what it shows of itself (None when nothing is
    compared)."""

    source: str
    header: StateHeader
    payload: bytearray
    evidence: Evidence | None = None


@dataclass
class CatchUpResult:
    """What a catch-up race ended with: the state to load (None: none believable), the source
    whose state agreed with it (None: taken uncompared), the sources whose state was implausible,
    and those whose plausible states were compared and agreed with nobody."""

    chosen: Fetched | None = None
    corroborated_by: str | None = None
    implausible: list[str] = field(default_factory=list)
    uncorroborated: list[str] = field(default_factory=list)


async def race_for_state(
    host: HostAPI,
    backend: ExpertBackend,
    phases: Sequence[Sequence[str]],
    *,
    swarm_id: str,
    config: ReplicasConfig,
    proven: Collection[str] = (),
) -> CatchUpResult:
    """Fetch ``backend``'s state from the sources of ``phases`` (see the module docstring),
    within ``catch_up_timeout``; ``proven``: sources whose standing with us can settle a
    standoff."""
    result = CatchUpResult()
    probes = probe_inputs(backend) if any(len(phase) >= 2 for phase in phases) else None
    fetched: list[Fetched] = []
    limiter = trio.CapacityLimiter(config.catch_up_parallel)
    request = request_for(backend)

    async def attempt(source: str, done: trio.CancelScope) -> None:
        async with limiter:
            if len(fetched) >= MAX_COMPARED:
                return
            try:
                header, payload = await fetch_state(
                    host, PeerID.from_string(source), request, swarm_id=swarm_id, config=config, paced=True,
                )
                # tensor work on a state of up to max_state_bytes: off the event loop
                await trio.to_thread.run_sync(check_plausible, backend, header, payload, config.plausible_norm_ratio)
                evidence = None
                if probes is not None:
                    evidence = await trio.to_thread.run_sync(evidence_of, backend, header, payload, probes)
            except ImplausibleStateError as exc:
                result.implausible.append(source)
                log.warning("catching up %s: %s's state refused: %s", backend.uid, source[-10:], describe(exc))
                return
            except (VolunteerError, trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                log.info("catching up %s from %s failed: %s", backend.uid, source[-10:], describe(exc))
                return
            fetched.append(Fetched(source, header, payload, evidence))
            if len(fetched) >= MAX_COMPARED:
                done.cancel()

    with trio.move_on_after(config.catch_up_timeout):
        for phase in phases:  # a later phase only if no source of the earlier delivered a state
            async with trio.open_nursery() as nursery:
                for source in phase:
                    nursery.start_soon(attempt, source, nursery.cancel_scope)
            if fetched:
                break
    if len(fetched) == 1:
        result.chosen = fetched[0]  # the only state any source delivered: nothing to compare it with
        log.info("catching up %s: only %s delivered a state; taken uncompared", backend.uid, fetched[0].source[-10:])
    elif fetched:
        side = believed_side(fetched, set(proven), config)
        if side is None:
            result.uncorroborated = [f.source for f in fetched]
        else:
            ordered = sorted(side, key=lambda f: f.header.version, reverse=True)
            result.chosen = ordered[0]
            result.corroborated_by = ordered[1].source if len(ordered) > 1 else None
            result.uncorroborated = [f.source for f in fetched if f not in side]
    return result


def believed_side(fetched: Sequence[Fetched], proven: set[str], config: ReplicasConfig) -> list[Fetched] | None:
    """The states of ``fetched`` (two or more, each with evidence) a joiner may believe: all of
    them when every pair agrees; else the side that every proven source's state agrees with,
    when there is exactly one such side and the states on it agree with each other; else None
    (a standoff: no count of identities decides it)."""
    evidence = [f.evidence for f in fetched]
    if any(e is None for e in evidence):
        return None
    agrees = [[agree(a, b, config) for b in evidence] for a in evidence]  # type: ignore[arg-type]
    everyone = range(len(fetched))
    if all(agrees[i][j] for i in everyone for j in everyone):
        return list(fetched)
    known = [i for i in everyone if fetched[i].source in proven]
    if not known:
        return None
    side = [i for i in everyone if all(agrees[i][k] for k in known)]
    if not side or any(not agrees[i][j] for i in side for j in side):
        return None
    return [fetched[i] for i in side]


__all__ = ["CatchUpResult", "Fetched", "MAX_COMPARED", "believed_side", "race_for_state"]
