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
    # catch-up from a source: its header within this, its payload at no less than this rate (a
    # squatter that takes the stream and stalls costs seconds, not transfer_timeout); sources are
    # raced this many at a time, every candidate tried within catch_up_timeout
    catch_up_header_timeout: float = 4.0
    catch_up_min_rate: float = 1 * MiB  # bytes per second
    catch_up_parallel: int = 2
    catch_up_timeout: float = 60.0
    # a declared version more than factor x (the other replicas' lower median) + margin is a
    # suspect claim, tried last; a caught-up state must be finite and its parameters' norm within
    # this ratio of a fresh initialisation's either way (all zeros or x10^6 are not a trained expert)
    version_claim_factor: float = 2.0
    version_claim_margin: int = 1000
    plausible_norm_ratio: float = 100.0
    # two fetched states corroborate each other when their outputs on random probe inputs are
    # within this relative L2 gap (honest replicas' outputs measured up to 0.6 apart within a
    # minute of a sync, 0.77 where rounds lagged; the trainers' audits, experts/comparison.py,
    # now compare direction and scale apart instead) and their parameters within
    # this one (replicas of one lineage drift a small share apart; independent initialisations are
    # about 1.4 apart, the expert negated 2)
    corroboration_tolerance: float = 0.6
    corroboration_parameter_gap: float = 0.5

    # --- replica sync -------------------------------------------------------------------------
    sync_period: float = 30.0  # default of a grid's sync_period
    sync_timeout: float = 10.0  # a round finishes with what it has this long after it starts
    max_group: int = 16  # replicas of one expert averaged together (the others are ignored)
    stash_ttl: float = 10.0  # a contribution that arrives before our round opens waits this long
    max_stashed_bytes: int = 512 * MiB  # contributions waiting for a round, all experts together
    # what a round believes (guard.py): a contribution may lie this many times the learned honest
    # drift from our parameters; the drift is learned from this many accepted distances; before
    # anything is learned a pair's first round bounds it by this share of our parameters' norm
    # (two volunteers that built the same expert at once from independent random initialisations
    # are about sqrt(2) norms apart, and their first round must merge them)
    sync_drift_slack: float = 3.0
    sync_drift_history: int = 16
    sync_bootstrap_share: float = 2.0
    # when we train, a merged distance teaches the drift at most this many of our own typical
    # training steps (honest replicas that train alike are about sqrt(2) steps apart after a
    # round): peers sitting at the bound cannot teach a wider one
    sync_drift_own_share: float = 1.5
    # a peer whose innovations (what it added since we last met: its difference from us, or the
    # change of it while unmerged) add up like a fixed push (forgotten at this rate a round; ratio
    # of |sum|^2 to the sum of squared norms past this after this many rounds: near 1 for honest
    # replicas, up to 19 for a push) is left out of groups of 3+ with standing
    sync_bias_decay: float = 0.9
    sync_bias_ratio: float = 4.0
    sync_bias_rounds: int = 4
    # ... and past this many times our own training steps' ratio (momentum makes honest steps,
    # and so honest replicas' differences, add up alike); the pull budget below widens the same way
    sync_bias_own_margin: float = 1.5
    # when we train, a round's merge moves us at most sync_pull_cap of our own typical training
    # step; honest merges pull us in directions about as independent from round to round as our
    # own steps, so the steady part of what merges moved us (the forgotten sum's squared norm less
    # the sum of squared norms, at sync_pull_decay a round) is held to sync_steady_budget steps
    # (squared) plus sync_pull_steadiness of the excess our own steps' ratio shows (momentum).
    # Only peers with standing (our lineage) pull us, and a follower's pulls toward a source that
    # never weighs it close a lasting gap over several rounds: at 1 and 0.5 such followers could
    # not follow (19 drifts apart in 40 rounds with momentum 0.7, benchmarks/sync_attacks.py)
    sync_pull_cap: float = 1.0
    sync_pull_decay: float = 0.98
    sync_steady_budget: float = 3.0
    sync_pull_steadiness: float = 2.0
    # parameters this large are hashed, encoded and decoded in a thread, off the event loop (an
    # 8 M-parameter expert takes ~100 ms); smaller ones right there: hashing 64 KiB costs about
    # what a thread hop does
    offload_bytes: int = 64 * 1024

    # --- placement and hand-off -----------------------------------------------------------
    recheck_period: float = 120.0  # placement is re-checked this often
    # each wait is the period times a factor in [1 - jitter, 1 + jitter], different per volunteer:
    # volunteers started together re-check one after the other, not in step
    recheck_jitter: float = 0.25
    # a re-check also follows each sync round that proves a co-holder not proven before (what
    # lets a duplicate pick move), within this many seconds, spread per volunteer
    early_recheck_spread: float = 10.0
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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ReplicaConfigError(f"ReplicasConfig.{f.name} must be a positive number, got {value!r}")


DEFAULT_CONFIG = ReplicasConfig()

__all__ = ["DEFAULT_CONFIG", "ReplicasConfig"]
