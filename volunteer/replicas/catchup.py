"""The catch-up race: fetch an expert's state from its live replicas until one can be believed.

Sources come ordered (``placement.catch_up_order``: freshest first, suspect version claims in a
second phase, tried only if no source of the first delivered a state: a suspect claim can
neither win against a believable source nor veto it). ``catch_up_parallel`` are fetched at a time,
each paced (a stalled or silent source is dropped within seconds, ``transfer.fetch_state``), and a
source that refuses or fails costs only itself. Every fetched state must be plausible (finite, at
a trained scale: ``state.check_plausible``); with two or more sources in a phase it must also be
corroborated: two fetched states that agree on random probe inputs (``corroborate.py``), of which
the fresher wins. A sole source, or the only one of several that delivered anything, is taken as
it is: there is nothing to compare it with.

What the race saw comes back as a ``CatchUpResult`` (who served what, who was refused and why);
the manager imports the winner and records standings and refusals.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Sequence

import trio

from ..errors import VolunteerError, describe
from ..experts.backend import ExpertBackend
from ..net.identity import PeerID
from ..net.service import HostAPI
from .config import ReplicasConfig
from .corroborate import Evidence, agreeing_pair, evidence_of, probe_inputs
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
    host: HostAPI, backend: ExpertBackend, phases: Sequence[Sequence[str]], *, swarm_id: str, config: ReplicasConfig
) -> CatchUpResult:
    """Fetch ``backend``'s state from the sources of ``phases`` (see the module docstring),
    within ``catch_up_timeout``."""
    result = CatchUpResult()
    probes = probe_inputs(backend) if any(len(phase) >= 2 for phase in phases) else None
    fetched: list[Fetched] = []
    limiter = trio.CapacityLimiter(config.catch_up_parallel)
    request = request_for(backend)

    def decide(done: trio.CancelScope) -> None:
        if probes is None:
            result.chosen = fetched[0]
        else:
            pair = agreeing_pair([f.evidence for f in fetched if f.evidence is not None], config)
            if pair is None:
                if len(fetched) >= MAX_COMPARED:
                    done.cancel()
                return
            chosen, other = sorted((fetched[i] for i in pair), key=lambda f: f.header.version, reverse=True)
            result.chosen, result.corroborated_by = chosen, other.source
        done.cancel()

    async def attempt(source: str, done: trio.CancelScope) -> None:
        async with limiter:
            if result.chosen is not None:
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
            if result.chosen is None:
                fetched.append(Fetched(source, header, payload, evidence))
                decide(done)

    with trio.move_on_after(config.catch_up_timeout):
        for phase in phases:  # a later phase only if no source of the earlier delivered a state
            async with trio.open_nursery() as nursery:
                for source in phase:
                    nursery.start_soon(attempt, source, nursery.cancel_scope)
            if fetched:
                break
    if result.chosen is None and len(fetched) == 1:
        result.chosen = fetched[0]  # the only state any source delivered: nothing to compare it with
        log.info("catching up %s: only %s delivered a state; taken uncompared", backend.uid, fetched[0].source[-10:])
    elif result.chosen is None:
        result.uncorroborated = [f.source for f in fetched]
    return result


__all__ = ["CatchUpResult", "Fetched", "MAX_COMPARED", "race_for_state"]
