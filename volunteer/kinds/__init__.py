"""Swarm kinds: the one plug through which a node, a trainer and the CLI meet a swarm's protocols.

    kind = kind_of(spec)            # the swarm file's ``kind`` picks it, here and nowhere else
    parts = kind.node_parts(...)    # a volunteer's services, in start order
    trainer = await kind.join_trainer(host, spec)   # a trainer's expert directory

``SwarmKind`` (``base``) says what a kind provides; ``ours`` (``kind = "volunteer"``) and
``hivemind`` implement it. ``options`` holds ``VolunteerOptions``, ``entry`` reaching a swarm's
entry points when a volunteer starts.
"""

from __future__ import annotations

from ..errors import VolunteerError
from ..swarmfile import SwarmSpec
from .base import (
    BuildBackend,
    Check,
    DoctorPlan,
    ExpertListing,
    ExpertServing,
    NodeContext,
    NodeParts,
    SwarmKind,
    TrainerParts,
)
from .hivemind import HivemindKind
from .ours import VolunteerKind

# the registry: a swarm file's ``kind`` -> the kind that speaks it (swarmfile.SWARM_KINDS names them)
KINDS: dict[str, SwarmKind] = {kind.name: kind for kind in (VolunteerKind(), HivemindKind())}


def kind_of(swarm: SwarmSpec | str) -> SwarmKind:
    """The kind of ``swarm`` (a SwarmSpec, or a kind's name)."""
    name = swarm if isinstance(swarm, str) else swarm.kind
    kind = KINDS.get(name)
    if kind is None:
        raise VolunteerError(f"unknown swarm kind {name!r}: expected one of {', '.join(KINDS)}")
    return kind


__all__ = [
    "BuildBackend",
    "Check",
    "DoctorPlan",
    "ExpertListing",
    "ExpertServing",
    "HivemindKind",
    "KINDS",
    "NodeContext",
    "NodeParts",
    "SwarmKind",
    "TrainerParts",
    "VolunteerKind",
    "kind_of",
]
