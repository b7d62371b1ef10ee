"""Every bound and tunable of the experts layer, in one dataclass (DESIGN.md, "Limits are part of
the protocol").

Backends, the runtime, the tensor wire format and error replies all take an ``ExpertsConfig``;
tests pass smaller values. Defaults favour latency: with ``min_batch_size=1`` the worker runs as
soon as it is idle, and batches form on their own from requests that arrive while it computes.
A volunteer with a big GPU raises ``min_batch_size`` and lets ``batch_window`` collect requests.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..errors import ExpertConfigError

MiB = 1024 * 1024

# A trainer's call timeouts (RemoteExpert, RemoteMixtureOfExperts); named here because the
# server's backward window must outlast a forward plus a backward of a patient trainer.
DEFAULT_FORWARD_TIMEOUT = 30.0
DEFAULT_BACKWARD_TIMEOUT = 60.0
SHARE_TRACEBACKS = ("full", "redacted", "none")


@dataclass(frozen=True)
class ExpertsConfig:
    """Bounds and tunables of one volunteer's experts. Frozen: share one instance freely."""

    # --- batching runtime --------------------------------------------------------------
    min_batch_size: int = 1  # samples a batch waits for ...
    batch_window: float = 0.002  # ... but never longer than this (seconds) after its oldest request
    max_batch_size: int = 1024  # samples per batch; also the largest single request
    max_queue: int = 256  # queued requests per expert and kind (forward/backward); more → BUSY
    max_queue_bytes: int = 1024 * MiB  # input bytes queued in the whole runtime; more → BUSY
    latency_window: int = 1024  # recent latencies kept per expert for p50/p95
    # A request the worker would take at once (idle runtime, nothing queued) whose kind of
    # call on that expert took at most this long (seconds; the cheapest of its last few runs,
    # scheduler.COSTS_REMEMBERED) runs right on the event loop:
    # two thread hand-offs (and the worker's GIL beside the reply's serialization) cost more than
    # a small batch (0 turns this off). It blocks the loop that long at most, and only when there
    # was nothing else to compute anyway. 5 ms takes a h256 b16 backward (about 1.5 ms): one
    # trainer's forward+backward overhead fell by a sixth to a fifth (benchmarks/server_ab.py).
    inline_compute_limit: float = 0.005

    # --- kept forward graphs (activations.py): a backward of the same inputs skips the recompute
    activation_cache_entries: int = 16  # graphs kept in the whole runtime (0 turns this off)
    activation_cache_bytes: int = 256 * MiB  # activations they hold, in all
    activation_cache_ttl: float = 60.0  # seconds a graph waits for its backward
    # --- kept forward inputs (activations.KeptInputs): a backward carries only its gradients
    kept_inputs_entries: int = 256  # forwards whose inputs wait for their backward, in all (0: off)
    kept_inputs_bytes: int = 256 * MiB  # their bytes, in all; one caller holds at most half of each

    # --- backends ----------------------------------------------------------------------------
    device: str = "auto"  # "auto": CUDA when present, else CPU; or any torch device string
    learning_rate: float = 1e-3  # of the default Adam optimizer
    max_grad_norm: float | None = None  # clip parameter gradients before each step, if set
    nan_check: bool = True  # refuse inputs and gradients holding NaN or inf
    # Exact audits (receipts.py, snapshots.py): a volunteer signs a receipt on every reply naming
    # a digest of the state that computed it and keeps those states for auditors; a trainer
    # requires receipts and settles disputes by recompute. It costs the volunteer a copy and a
    # digest of the expert per state version (one per optimizer step while it trains: ~60 ms for
    # a 32 MB expert here), so a swarm asks for it in its file (``receipts = true``).
    receipts: bool = False
    # A trainer is a principal too (gradbound.py, trainers.py): each backward's parameter gradient
    # is clipped to grad_bound_factor times the median of the last grad_bound_window norms the
    # expert took (none for its first grad_bound_warmup), and a gradient past grad_bound_gross
    # times that bound is refused with its trainer. 10x covers honest spikes and trainers whose
    # batch sizes differ; a x1e6 gradient is 1e5 times past it.
    grad_bound_factor: float = 10.0
    grad_bound_gross: float = 100.0
    grad_bound_window: int = 64
    grad_bound_warmup: int = 8
    # A trainer with trainer_max_strikes clipped gradients within trainer_strike_window seconds
    # (or one gross one) is refused backwards for trainer_refusal seconds (doubling at each
    # repeat), and the experts it struck go back to their state before its first strike.
    trainer_max_strikes: int = 3
    trainer_strike_window: float = 120.0
    trainer_refusal: float = 600.0
    trainer_share_window: int = 64  # an expert's recent backwards, for each trainer's share of them
    checkpoint_every: int = 1000  # optimizer updates between checkpoints (0: only on shutdown)

    # --- tensor wire format ----------------------------------------------------------------
    max_tensors: int = 64  # tensors in one call
    max_ndim: int = 8  # dimensions of one tensor, batch included
    max_payload_bytes: int = 256 * MiB  # serialized bytes of all tensors of one call
    chunk_size: int = 1 * MiB  # serialize() yields chunks of at most this many bytes

    # --- server admission: what one caller, and all callers, may make us hold ---------------
    # Announced request bytes are reserved when a header arrives and released when the call
    # ends; past either bound the call is refused BUSY before a payload byte is read. Per peer:
    # two calls of the largest size, so one trainer can pipeline; in all: as much as the
    # runtime may queue, which a 24 GiB desktop holds easily next to its experts.
    max_request_bytes_per_peer: int = 512 * MiB
    max_request_bytes_total: int = 1024 * MiB
    # The hivemind door (volunteer/hivemind/experts.py): request bytes reserved from the Host's
    # resource manager, per peer, per source address and in all. hivemind's client sends a
    # call's tensors whole (a forward's inputs, 2 MiB for a 512 x 1024 float32 batch; a
    # backward's inputs and gradients, twice that), so a trainer with its k_best calls and a
    # backward in flight holds ~16 MiB; 48 MiB a peer is three such steps, or one call of a
    # 12288 x 1024 batch. An address (a household's trainers, or one attacker's many identities)
    # holds 64 MiB, all callers 96 MiB (held calls cost ~1.3 times their bytes: ~125 MiB), so
    # that the hivemind door's budgets together (the DHT's and its storage's too) stay within
    # 256 MiB.
    hivemind_request_bytes_per_peer: int = 48 * MiB
    hivemind_request_bytes_per_address: int = 64 * MiB
    hivemind_request_bytes_total: int = 96 * MiB

    # --- backward authorization ----------------------------------------------------------
    # A backward steps the expert's optimizer: only a peer that ran forward on that expert this
    # recently may call it. 5 min covers a trainer's forward + backward timeouts (90 s by
    # default) with room for a slow training step between them.
    backward_window: float = 300.0
    max_forward_records: int = 65536  # (peer, expert) pairs remembered, least recent dropped

    # --- error replies ---------------------------------------------------------------------
    max_error_message: int = 4096  # characters of a remote exception's message
    max_error_traceback: int = 16384  # characters of a remote traceback (the tail is kept)
    max_error_field: int = 256  # characters of type names, uids and peer ids in an error reply
    # What our errors show trainers: "full" tracebacks, "redacted" (type, message, frames with
    # paths relative to the package or ~: no user names or directory layout), or "none".
    share_tracebacks: str = "redacted"

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
                raise ExpertConfigError(f"ExpertsConfig.{f.name} must not be negative, got {value!r}")
        if not 1 <= self.min_batch_size <= self.max_batch_size:
            raise ExpertConfigError("ExpertsConfig needs 1 <= min_batch_size <= max_batch_size")
        if self.max_queue < 1 or self.chunk_size < 1 or self.max_tensors < 1 or self.max_ndim < 1:
            raise ExpertConfigError("ExpertsConfig: max_queue, chunk_size, max_tensors, max_ndim must be >= 1")
        if self.grad_bound_factor <= 1 or self.grad_bound_gross <= 1:
            raise ExpertConfigError("ExpertsConfig: grad_bound_factor and grad_bound_gross must be > 1")
        if min(self.grad_bound_window, self.grad_bound_warmup, self.trainer_max_strikes, self.trainer_share_window) < 1:
            raise ExpertConfigError(
                "ExpertsConfig: grad_bound_window, grad_bound_warmup, trainer_max_strikes, trainer_share_window must be >= 1"
            )
        if self.latency_window < 1:
            raise ExpertConfigError("ExpertsConfig.latency_window must be >= 1")
        if not self.max_payload_bytes <= self.max_request_bytes_per_peer <= self.max_request_bytes_total:
            raise ExpertConfigError(
                "ExpertsConfig needs max_payload_bytes <= max_request_bytes_per_peer <= max_request_bytes_total"
            )
        if not (0 < self.hivemind_request_bytes_per_peer <= self.hivemind_request_bytes_per_address
                <= self.hivemind_request_bytes_total):
            raise ExpertConfigError(
                "ExpertsConfig needs 0 < hivemind_request_bytes_per_peer <= hivemind_request_bytes_per_address"
                " <= hivemind_request_bytes_total"
            )
        if self.backward_window < DEFAULT_FORWARD_TIMEOUT + DEFAULT_BACKWARD_TIMEOUT:
            raise ExpertConfigError(
                f"ExpertsConfig.backward_window must be at least a trainer's forward plus backward timeout "
                f"({DEFAULT_FORWARD_TIMEOUT + DEFAULT_BACKWARD_TIMEOUT:g} s), got {self.backward_window!r}"
            )
        if self.max_forward_records < 1:
            raise ExpertConfigError("ExpertsConfig.max_forward_records must be >= 1")
        if self.share_tracebacks not in SHARE_TRACEBACKS:
            raise ExpertConfigError(
                f"ExpertsConfig.share_tracebacks must be one of {', '.join(SHARE_TRACEBACKS)}, got {self.share_tracebacks!r}"
            )


DEFAULT_CONFIG = ExpertsConfig()
