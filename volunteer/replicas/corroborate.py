"""Comparing fetched states before a joiner loads one: do two states hold the same expert?

A state served for catch-up is a claim like any other. Its finiteness and norm are checked
(``state.check_plausible``), but a liar can serve a finite state of the right scale that is not
the expert's (a fresh initialisation, the honest one negated): only comparison tells. Replicas of
one expert drift apart between syncs, so their states are never bit-identical and a digest cannot
match; what they share is lineage and behaviour. Two states ``agree`` when their answers to
``probes`` (random inputs, drawn afresh each time so a liar cannot prepare for them) are within
``corroboration_tolerance`` of each other (the relative L2 gap of ``audit.distance``; the
largest gap honest replicas show within a minute of a sync, the figure trainers' audits use) and
their parameters within ``corroboration_parameter_gap`` (replicas share an initialisation and
drift from it by a small share; independent initialisations are about 1.4 apart, a negated
expert 2). Agreement is never counted: ``catchup.believed_side`` loads a state only when no
delivered state contradicts it, or our proven sources settle the dispute.

``agree`` is the policy; ``probe_inputs`` and ``evidence_of`` are the tensor work, which the
catch-up race runs off the event loop.
"""

from __future__ import annotations

import copy
import secrets
from dataclasses import dataclass
from typing import Sequence

import torch

from ..experts.distance import distance
from ..experts.backend import ExpertBackend
from .config import ReplicasConfig
from .messages import StateHeader, split_payload
from .state import MODULE

PROBE_BATCH = 16  # probe inputs per comparison: enough that one lucky row decides nothing
FREE_SIZE = 8  # the size given to a schema's free dimensions (a sequence length, say)


def probe_inputs(backend: ExpertBackend, seed: int | None = None) -> list[torch.Tensor] | None:
    """Random standard-normal inputs fitting ``backend``'s schema (``seed``: fresh when None);
    None when an input is not floating point (nothing to draw it from)."""
    if not all(spec.dtype.is_floating_point for spec in backend.inputs):
        return None
    generator = torch.Generator().manual_seed(secrets.randbits(63) if seed is None else seed)
    return [
        torch.randn(PROBE_BATCH, *(FREE_SIZE if size is None else size for size in spec.shape), generator=generator)
        .to(spec.dtype)
        for spec in backend.inputs
    ]


@dataclass(frozen=True)
class Evidence:
    """What a fetched state shows of itself: its module's answers to the probes, and its module
    parameters flattened (float32, in name order)."""

    answers: list[torch.Tensor]
    parameters: torch.Tensor


def evidence_of(
    backend: ExpertBackend, header: StateHeader, payload: bytes | bytearray, probes: Sequence[torch.Tensor]
) -> Evidence:
    """The ``Evidence`` of the state ``header``/``payload`` (already verified and plausible),
    computed on a copy of ``backend``'s module (its own is untouched)."""
    tensors = split_payload(header.tensors, payload)
    module_state = {name[len(MODULE):]: t for name, t in sorted(tensors.items()) if name.startswith(MODULE)}
    module = copy.deepcopy(backend.module)
    with torch.no_grad():
        module.load_state_dict(module_state)
        module.eval()
        outputs = module(*(p.to(backend.device) for p in probes))
    answers = [outputs] if isinstance(outputs, torch.Tensor) else list(outputs)
    flat = [t.detach().reshape(-1).float().cpu() for t in module_state.values() if t.is_floating_point()]
    return Evidence([t.detach().cpu() for t in answers], torch.cat(flat) if flat else torch.zeros(0))


def agree(first: Evidence, second: Evidence, config: ReplicasConfig) -> bool:
    """Whether two states are the same expert as far as replicas' honest drift goes: their answers
    within ``corroboration_tolerance`` and their parameters within ``corroboration_parameter_gap``
    (a residual block answers much like its input whatever its weights, so answers alone would
    let a fresh initialisation pass; parameters alone would miss a function-changing edit)."""
    return (distance(first.answers, second.answers) <= config.corroboration_tolerance
            and distance([first.parameters], [second.parameters]) <= config.corroboration_parameter_gap)


__all__ = ["Evidence", "PROBE_BATCH", "agree", "evidence_of", "probe_inputs"]
