"""Every bound and timing of replicated expert state, in one dataclass (DESIGN.md, "Limits are
part of the protocol"). Tests pass smaller values; the defaults are the issue's (sync every 30 s,
re-check placement every 120 s, a leave waits 20 s for hand-offs, 8 experts without a GPU)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from .errors import ReplicaConfigError

MiB = 1024 * 1024


@dataclass(frozen=True)
class ReplicasConfig:
    """Bounds and timings of state transfer, replica sync, placement and hand-off."""

    # --- wire bounds (both protocols) -----------------------------------------------------
    max_message: int = 1 * MiB  # a msgpack header: a state's tensor list for a big transformer fits
    max_state_bytes: int = 2048 * MiB  # one expert's parameters + optimizer state (8 M params: ~100 MiB)
    max_state_tensors: int = 4096  # tensors in one state (module + optimizer)
    max_tensor_ndim: int = 8
    max_name: int = 256  # characters of a tensor name or an expert class
    max_scalars: int = 4096  # non-tensor optimizer values carried in a header
    chunk_size: int = 1 * MiB  # payload bytes per write

    # --- state transfer ---------------------------------------------------------------------
    request_timeout: float = 30.0  # a peer has this long to send its request or offer
    transfer_timeout: float = 300.0  # a whole fetch or push, payload included
    max_concurrent_transfers: int = 4  # served at once; more get "busy" (bounds memory)

    # --- replica sync -------------------------------------------------------------------------
    sync_period: float = 30.0  # default of a grid's sync_period
    sync_timeout: float = 10.0  # a round finishes with what it has this long after it starts
    max_group: int = 16  # replicas of one expert averaged together (the others are ignored)
    stash_ttl: float = 10.0  # a contribution that arrives before our round opens waits this long
    max_stashed_bytes: int = 512 * MiB  # contributions waiting for a round, all experts together
    # parameters this large are hashed, encoded and decoded in a thread, off the event loop (an
    # 8 M-parameter expert takes ~100 ms); smaller ones right there: hashing 64 KiB costs about
    # what a thread hop does
    offload_bytes: int = 64 * 1024

    # --- placement and hand-off -----------------------------------------------------------
    recheck_period: float = 120.0  # placement is re-checked this often
    max_moves_per_recheck: int = 1  # experts moved per re-check: a gentle rebalance, no thrash
    default_capacity: int = 8  # experts hosted on a machine without a GPU and no --max-experts
    handoff_timeout: float = 20.0  # a graceful leave waits this long for its hand-offs
    handoff_candidates: int = 3  # receivers tried per expert, best first
    # a declared host we are not connected to must answer a dial this fast to count as alive: a
    # killed volunteer's declarations outlive it by up to an expiration, and placement must not
    # count it as a replica meanwhile (one that is merely slow is counted out: one copy too many)
    liveness_timeout: float = 5.0
    max_liveness_checks: int = 16  # dials at once while checking a survey's hosts

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ReplicaConfigError(f"ReplicasConfig.{f.name} must be a positive number, got {value!r}")


DEFAULT_CONFIG = ReplicasConfig()

__all__ = ["DEFAULT_CONFIG", "ReplicasConfig"]
