"""Where a host stands with a trainer: the vocabulary ``trust.py`` keeps, which a replica also
reads back from its peers' declarations to choose whom to sync with.

Part of the experts' shared core (with ``distance.py``, ``config``, ``layers``, ``schema``,
``tensors``, ``protocol``, ``receipts``, ``failures``): the volunteer side (server, runtime,
replicas) and the trainer side (client, mixture, audits, trust) import the core and never each
other (an import-linter contract says so). No torch here: ``trust.py`` stays pure.
"""

from __future__ import annotations

from enum import Enum


class Standing(str, Enum):
    """Where a host stands with a trainer, for one expert (``TrustLedger.standing``) or in all
    (``TrustLedger.peer_standing``)."""

    UNPROVEN = "unproven"
    PROVEN = "proven"
    SUSPECT = "suspect"
    OUTVOTED = "outvoted"
    STALE = "stale"
    EXCLUDED = "excluded"


__all__ = ["Standing"]
