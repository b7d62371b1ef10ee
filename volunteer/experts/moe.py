"""RemoteMixtureOfExperts: a gating network over a grid of experts hosted by volunteers.

For a batch ``x`` of shape ``[batch, in_features]``:
1. the gate scores every grid dimension (``grid_size=(4, 4)``: 4 + 4 scores per sample); an
   expert's score is the sum of its coordinates' scores (Learning@home's product-key grid);
2. the live experts come from the swarm's directory (``swarm.directory.find_grid``; ours reads
   the grid's prefix records from the DHT), cached and refreshed in the background every
   ``refresh_period`` seconds, so no forward waits for a lookup but the first; each sample picks
   its ``k_best`` highest-scoring live experts, skipping experts that failed recently (``backoff``);
3. each chosen expert gets one call with all the samples that chose it, all calls in parallel
   (``rounds.py``: a round of calls as one autograd node; tensors as float16, or 8-bit on a link measured slow: ``compression="auto"``); once every
   sample has ``k_min`` answers, stragglers get ``timeout_after_k_min`` more;
4. samples still short of ``k_min`` go to their next-best live experts by gate score (not tried
   yet in this forward, not failed) in a second round, bounded like the first;
5. outputs are combined with softmax weights over the scores of the experts that answered; a
   sample still short after both rounds gets a zero output. Only a step where no expert answered
   at all raises, so a training loop survives anything short of the whole grid being gone.
``stats`` counts ``calls``, ``failures``, ``samples_short`` (zero outputs) and ``rerouted``
(samples sent to a second round), and shows per expert where its calls spend their time.
Backward goes only to the experts that answered forward (their optimizers step), with only the
gradients: the volunteers kept the forward's inputs. A failed backward call only loses that
expert's gradient. Gradients reach the gate through the weights.

Every reply passes the swarm's guard first (``guard.py``: NaN, infinity or an implausible scale
fail the call, which then fails over like any failure) and some are audited against a second
replica (``audit.py``); hosts are chosen with the trust ledger's weights (``trust.py``) and an
excluded host is never called. ``stats`` also counts ``rejected`` replies, ``audits``,
``disagreements``, ``exclusions``, ``unauditable`` (no comparable replica), ``audits_skipped`` and
``audits_deferred`` (floor audits past their cost budget, ``AuditConfig.cost_share``).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any, Sequence

import torch
from torch import nn

from ..errors import (
    ExpertError,
    ExpertPeerUnreachableError,
    ExpertReplyRejected,
    ExpertUnavailableError,
    describe,
)
from ..dht.grid import parse_uid
from .audit import Auditor
from .callstats import AUTO, CallReport
from .client import DUMMY, _Call, fetch_state
from .comparison import DEFAULT_AUDITS, AuditConfig, aligned
from .config import DEFAULT_BACKWARD_TIMEOUT, DEFAULT_FORWARD_TIMEOUT
from .directory import TrainerSwarm
from .guard import ReplyGuard
from .rounds import NothingAnswered, ParallelCalls, Round, worst_error
from .trust import Standing, TrustLedger

log = logging.getLogger(__name__)

STALE_AFTER = 10  # refresh periods: a grid cache this old is looked up again before a forward uses it
GRID_LOOKUP_TIMEOUT = 30.0  # a grid lookup that takes longer fails the forward that needed it
# seconds a replica's measured latency steers picks: a replica measured slow once (its first call
# under load) is picked as rarely as that says, so no later call would measure it again; past
# this it counts as typical, is picked again and measured anew
LATENCY_MEMORY = 10.0


def _recent(measured: tuple[float, float] | None, now: float) -> float | None:
    """A (seconds, measured at) latency entry's seconds, if measured within ``LATENCY_MEMORY``."""
    if measured is None or now - measured[1] > LATENCY_MEMORY:
        return None
    return measured[0]


class RemoteMixtureOfExperts(nn.Module):
    """A mixture of the live experts ``uid_prefix.i.j…`` of a swarm, usable as a local layer.

    ``grid``: a swarm file's ``[[grid]]`` (``swarm.spec.grids[0]``) instead of ``grid_size`` and
    ``uid_prefix``, so trainers address what volunteers place themselves on. An expert with
    several replicas gets each call from one of them, drawn by load and measured latency; the
    backward of a call goes to the replica that ran its forward.

    ``per_sample``: an input ``[batch, ..., in_features]`` goes to the experts sample by sample,
    each whole, gated by its mean over the middle dims (as hivemind's mixture does), for experts
    that take sequences (``transformer``); by default every position is a token of its own,
    routed alone (feed-forward experts such as ``ffn``)."""

    def __init__(
        self,
        swarm: TrainerSwarm,
        *,
        in_features: int,
        grid_size: Sequence[int] | None = None,
        uid_prefix: str = "expert",
        grid=None,
        k_best: int = 4,
        k_min: int = 1,
        forward_timeout: float = DEFAULT_FORWARD_TIMEOUT,
        backward_timeout: float = DEFAULT_BACKWARD_TIMEOUT,
        timeout_after_k_min: float = 1.0,
        backoff: float = 60.0,
        refresh_period: float = 2.0,
        compression: str = AUTO,
        guard: ReplyGuard | None = None,
        audits: bool = True,
        audit_config: AuditConfig = DEFAULT_AUDITS,
        per_sample: bool = False,
    ) -> None:
        super().__init__()
        if k_min < 1 or k_best < k_min:
            raise ValueError("need 1 <= k_min <= k_best")
        self.swarm = swarm
        self.in_features = in_features
        self.per_sample = per_sample
        if grid is not None:  # a swarm file's [[grid]] (swarmfile.GridSpec): what volunteers host
            grid_size, uid_prefix = grid.size, grid.prefix
        if grid_size is None:
            raise ValueError("give grid_size (and uid_prefix), or a swarm file's grid")
        self.grid_size = tuple(int(g) for g in grid_size)
        self.uid_prefix = uid_prefix.rstrip(".")
        self.k_best, self.k_min = k_best, k_min
        self.forward_timeout, self.backward_timeout = forward_timeout, backward_timeout
        self.timeout_after_k_min = timeout_after_k_min
        self.backoff = backoff
        self.refresh_period = refresh_period
        self.compression = compression
        self.gate = nn.Linear(in_features, sum(self.grid_size))
        self._live: dict[str, list] = {}
        self._live_at = float("-inf")
        self._refreshing = threading.Lock()  # held while a background lookup runs
        self._avoid: dict[tuple[str, str], float] = {}  # (uid, peer) -> avoid until (monotonic)
        self._strikes: dict[tuple[str, str], int] = {}  # consecutive failures per (uid, peer)
        self._refused_by: set[str] = set()  # volunteers that refused our backwards (told once each)
        self._failed_now: set[tuple[str, str]] = set()  # failed during the current forward
        # peer -> (moving average of forward call seconds, when last measured, monotonic)
        self._latency: dict[str, tuple[float, float]] = {}
        self._random = random.Random()
        self._counts = {"calls": 0, "failures": 0, "samples_short": 0, "rerouted": 0, "failed_over": 0, "rejected": 0,
                        "backward_retried": 0}
        # the swarm's guard and trust ledger, shared by its mixtures (a mixture built without a
        # swarm, to test its choices, keeps its own)
        self.guard = guard or (swarm.guard if swarm is not None else ReplyGuard(TrustLedger()))
        self.trust = self.guard.ledger
        self._auditor = Auditor(
            self.trust, self._replicas_for_audit, self._audit_call, self._counts, config=audit_config,
            compression=compression, backward_wait=forward_timeout + backward_timeout, rng=self._random,
            fetch_snapshot=self._fetch_snapshot, on_proof=swarm.publish_proof if swarm is not None else None,
        )
        self._auditor.enabled = audits

    @property
    def stats(self) -> dict:
        """The counters (``calls``, ``failures``, ``samples_short``, ``rerouted``, ``failed_over``,
        the checks' ``rejected`` and ``backward_retried`` (a rejected backward answered by another
        replica), ``audits``, ``disagreements``, ``outvoted``, ``exclusions``, ``stale``, ``unauditable``,
        ``audits_skipped``, ``audits_deferred``) and ``experts``: where the calls to each of the grid's experts spend
        their time, per host (``swarm.calls``, as ``Swarm.expert_stats``: path, round trip, bytes
        per call, network vs volunteer time)."""
        experts = self.swarm.calls.snapshot(self.uid_prefix) if self.swarm is not None else {}
        return {**self._counts, "experts": experts}

    @property
    def calls(self) -> int:
        """Expert calls made (``stats["calls"]``)."""
        return self._counts["calls"]

    @property
    def failures(self) -> int:
        """Expert calls that failed, forward or backward (``stats["failures"]``)."""
        return self._counts["failures"]

    @property
    def audits(self) -> bool:
        """Whether calls are audited (a second replica answers some of them too, ``audit.py``);
        the guard checks every reply either way."""
        return self._auditor.enabled

    @audits.setter
    def audits(self, on: bool) -> None:
        self._auditor.enabled = bool(on)

    # --- experts ---------------------------------------------------------------------------------
    def live_experts(self, *, refresh: bool = False) -> dict[str, list]:
        """``{uid: [host declarations]}`` of the grid. The first call (and ``refresh=True``) looks
        the grid up and waits for it; after that, a cache older than ``refresh_period`` is
        refreshed in the background while the forward goes on with it (a lookup is a round trip
        or two to the DHT, as long as a step on a fast home line), unless it is older than
        ``STALE_AFTER`` refresh periods (the background lookups keep failing): then we wait."""
        age = time.monotonic() - self._live_at
        if refresh or age >= STALE_AFTER * self.refresh_period:
            self._set_live(self._find_grid())
        elif age >= self.refresh_period and self._refreshing.acquire(blocking=False):
            threading.Thread(target=self._refresh_in_background, name="grid-refresh", daemon=True).start()
        return self._live

    def _refresh_in_background(self) -> None:
        try:
            self._set_live(self._find_grid())
        except Exception as exc:  # the forward goes on with the cache; the next period tries again
            log.info("background lookup of grid %r failed: %s", self.uid_prefix, describe(exc))
        finally:
            self._refreshing.release()

    def _find_grid(self) -> dict[str, list]:
        return self.swarm.loop.run(self.swarm.directory.find_grid, self.uid_prefix, self.grid_size,
                                   timeout=GRID_LOOKUP_TIMEOUT)

    def _set_live(self, found: dict[str, list]) -> None:
        valid = {}
        for uid, hosts in found.items():
            try:
                name, coords = parse_uid(uid)
            except ValueError:
                continue
            if name == self.uid_prefix and len(coords) == len(self.grid_size) and all(
                c < g for c, g in zip(coords, self.grid_size)
            ):
                valid[uid] = hosts
        self._live, self._live_at = valid, time.monotonic()

    def _pick_host(self, uid: str, hosts: list):
        """One of the expert's replicas, drawn with weight 1 / ((1 + load) x latency): calls
        spread over the replicas, most to the idle and near ones (a host not measured within
        ``LATENCY_MEMORY`` counts as the median of those that were)."""
        now = time.monotonic()
        eligible = [
            decl for decl in hosts
            if self._avoid.get((uid, str(decl.peer)), 0) <= now and (uid, str(decl.peer)) not in self._failed_now
            and self._callable(uid, decl)
        ]
        if len(eligible) <= 1:
            return eligible[0] if eligible else None
        latency = self._recent_latency(now)
        known = sorted(latency.values())
        typical = known[len(known) // 2] if known else 0.05
        weights = [
            self.trust.pick_weight(uid, str(d.peer))
            / ((1.0 + max(0.0, d.load)) * max(1e-3, latency.get(str(d.peer), typical)))
            for d in eligible
        ]
        return self._random.choices(eligible, weights)[0]

    def _callable(self, uid: str, decl) -> bool:
        """The ledger still lets ``uid`` be picked from this host (neither excluded, nor outvoted
        or stale for it). A stale host that declares a recent sync again is taken back, unproven:
        its audits are strict from now on."""
        peer = str(decl.peer)
        if self.trust.standing(uid, peer) is Standing.STALE and aligned(self._auditor.config, self._declared_age(decl)):
            self.trust.realigned(uid, peer)
        return self.trust.pick_weight(uid, peer) > 0.0

    def _declared_age(self, decl) -> float | None:
        """``decl``'s sync age, plus how old the declaration may be by now."""
        if decl.synced_age is None:
            return None
        return decl.synced_age + self._auditor.config.heartbeat_slack + max(0.0, time.monotonic() - self._live_at)

    def _failed(self, call: _Call, error: BaseException | None = None) -> None:
        # Exponential back-off per (expert, host) from the second failure in a row: a dead host's
        # experts are skipped for up to ``backoff`` seconds after two tries, while an expert that
        # failed once (a random drop: the next call just picks it again) stays in the pool.
        self._counts["failures"] += 1
        key = (call.uid, str(call.peer))
        strikes = self._strikes.get(key, 0) + (2 if isinstance(error, ExpertPeerUnreachableError) else 1)
        self._strikes[key] = strikes
        self._failed_now.add(key)
        if strikes >= 2:
            self._avoid[key] = time.monotonic() + min(self.backoff, 2.0 ** (strikes - 1))

    def _recent_latency(self, now: float) -> dict[str, float]:
        """Each peer's moving average of call seconds, if measured within ``LATENCY_MEMORY``."""
        return {peer: seconds for peer, measured in self._latency.items() if (seconds := _recent(measured, now)) is not None}

    def _answered(self, call: _Call, seconds: float | None = None) -> None:
        key = (call.uid, str(call.peer))
        if seconds is not None:
            now = time.monotonic()
            last = _recent(self._latency.get(str(call.peer)), now)
            if last is not None:  # a forgotten average starts anew
                seconds = 0.8 * last + 0.2 * seconds
            self._latency[str(call.peer)] = (seconds, now)
        if key in self._strikes:
            del self._strikes[key]
            self._avoid.pop(key, None)

    # --- checks (guard.py, audit.py) -----------------------------------------------------------
    def _rejected(self, call: _Call, inputs: torch.Tensor | None, error: ExpertReplyRejected, receipt=None) -> None:
        """The guard rejected ``call``'s reply: counted; a forward's finite reply is recomputed
        (with a receipt) or kept for the auditor to compare with what the fail-over gets."""
        self._counts["rejected"] += 1
        if inputs is None:  # a backward's: the gradient is dropped, nothing to compare
            if error.excluded:
                self._counts["exclusions"] += 1
            return
        self._auditor.rejected(call, inputs, error, receipt)

    async def _fetch_snapshot(self, peer, uid: str, digest: bytes):
        """The snapshot a receipt of ``peer`` named, for an exact audit (``audit.py``), with the
        host's signed binding (its digest is checked only if a proof is found: it goes with it)."""
        fetched = await fetch_state(self.swarm.directory, peer, uid, digest, self.forward_timeout, check_digest=False)
        return fetched.names, fetched.tensors, fetched.binding

    def _replicas_for_audit(self, uid: str) -> list[tuple[Any, float | None]]:
        """(declaration, sync age) of the hosts of ``uid`` an audit may call now: neither
        excluded nor backed off. The age adds how old the declaration may be by now."""
        now = time.monotonic()
        return [
            (decl, self._declared_age(decl))
            for decl in self._live.get(uid, [])
            if self._avoid.get((uid, str(decl.peer)), 0) <= now and not self.trust.excluded(str(decl.peer))
        ]

    async def _backward_elsewhere(self, call: _Call, inputs: torch.Tensor, grad: torch.Tensor) -> torch.Tensor | None:
        """The input gradient of ``call``'s backward, whose reply the guard rejected (or whose host
        was excluded since its forward), from
        another replica of its expert (whole inputs: that one kept none); None when no other
        replica can be called or its reply fails too. The other replica takes the gradient as an
        ordinary backward: its training step is the one the liar's host was sent."""
        others = [decl for decl, _ in self._replicas_for_audit(call.uid) if str(decl.peer) != str(call.peer)]
        other = self._pick_host(call.uid, others)
        if other is None:
            return None
        # a volunteer takes a backward only after our forward on it (admission.py): the retry is
        # an ordinary forward and backward of the same inputs there
        retry = self._audit_call(call.uid, other, backward_follows=True)
        report = CallReport()
        try:
            await retry.forward([inputs], report)
            gradient = (await retry.backward([inputs], [grad], report.kept))[0]
        except ExpertError as exc:
            log.info("backward to %s retried on %s failed too: %s", call.uid, str(other.peer)[-8:], describe(exc))
            self._failed(retry, exc)
            return None
        self._counts["backward_retried"] += 1
        return gradient

    def _audit_call(self, uid: str, decl, backward_follows: bool) -> _Call:
        """A call to one replica for an audit, as ordinary as a call of ``_round``."""
        return _Call(self.swarm, uid, decl.peer, self.forward_timeout, self.backward_timeout, self.compression,
                     backward_follows=backward_follows, addrs=decl.addrs, stats=self.swarm.calls, guard=self.guard,
                     vouches=self.swarm.vouches)

    # --- forward -----------------------------------------------------------------------------------
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.per_sample:
            # whole samples to the experts; the gate reads each one's mean over its middle dims
            rows, gating = x, x.mean(dim=tuple(range(1, x.dim() - 1))) if x.dim() > 2 else x
        else:
            rows = gating = x.reshape(-1, self.in_features)
        self._failed_now.clear()
        self._auditor.begin_forward()
        try:
            result = self._forward(rows, gating)
        finally:
            self._failed_now.clear()
        return result if self.per_sample else result.reshape(*x.shape[:-1], *result.shape[1:])

    def _choices(self) -> list:
        """(uid, declaration) of every live expert not backed off, sorted by uid."""
        live = self.live_experts()
        choices = [(uid, self._pick_host(uid, hosts)) for uid, hosts in sorted(live.items())]
        chosen = [(uid, host) for uid, host in choices if host is not None]
        if len(chosen) < min(self.k_best, len(live)):
            # Back-off must never starve a step: with fewer than k_best experts left, the backed-off
            # ones whose back-off ends soonest come back (a random failure streak on many experts
            # once left two, and a step with both failing raised though fourteen were alive).
            waiting = sorted(
                ((min(self._avoid.get((uid, str(d.peer)), 0.0) for d in hosts), uid, hosts)
                 for uid, hosts in live.items() if uid not in {u for u, _ in chosen} and hosts),
                key=lambda item: item[0],
            )
            for _, uid, hosts in waiting[: min(self.k_best, len(live)) - len(chosen)]:
                for decl in hosts:
                    self._avoid.pop((uid, str(decl.peer)), None)
                host = self._pick_host(uid, hosts)
                if host is not None:
                    chosen.append((uid, host))
            chosen.sort(key=lambda item: item[0])
        if not chosen:
            raise ExpertUnavailableError(f"no live experts under {self.uid_prefix!r} in swarm {self.swarm.swarm_id!r}")
        return chosen

    def _forward(self, flat: torch.Tensor, gating: torch.Tensor) -> torch.Tensor:
        """``flat``: what the experts get, one row per routed item; ``gating``: what the gate
        reads of each row ([rows, in_features])."""
        batch = flat.shape[0]
        scores = self.gate(gating).split(self.grid_size, dim=-1)
        choices = self._choices()
        coords = torch.tensor([parse_uid(uid)[1] for uid, _ in choices], device=flat.device)
        expert_scores = sum(dim_scores[:, coords[:, d]] for d, dim_scores in enumerate(scores))  # [batch, experts]
        k = min(self.k_best, len(choices))
        need = min(self.k_min, k)
        tried = torch.zeros((batch, len(choices)), dtype=torch.bool)  # sample b was sent to expert e
        tried.scatter_(1, expert_scores.detach().cpu().topk(k, dim=-1).indices, True)
        answered = torch.zeros_like(tried)
        failed_experts: set[int] = set()
        errors: list[BaseException] = []
        parts = self._round(flat, choices, tried, [need] * batch, answered, failed_experts, errors)
        parts += self._fail_over(flat, choices, tried, need, answered, failed_experts, errors)

        short = (answered.sum(-1) < need).nonzero().flatten().tolist()
        if short:
            # Second round: each short sample's next-best experts by gate score, among those it
            # has not tried and that did not fail in this forward.
            allowed = ~tried
            if failed_experts:
                allowed[:, sorted(failed_experts)] = False
            ranked = expert_scores.detach().cpu().masked_fill(~allowed, float("-inf")).argsort(dim=-1, descending=True)
            second = torch.zeros_like(tried)
            deficits = [0] * batch
            for b in short:
                deficits[b] = need - int(answered[b].sum())
                picks = [e for e in ranked[b, : deficits[b]].tolist() if allowed[b, e]]
                second[b, picks] = True
            rerouted = int(second.any(-1).sum())
            if rerouted:
                self._counts["rerouted"] += rerouted
                tried |= second
                parts += self._round(flat, choices, second, deficits, answered, failed_experts, errors)

        if not answered.any():
            raise worst_error(errors) if errors else ExpertUnavailableError("no expert answered")
        complete = answered.sum(-1) >= need  # samples with k_min answers; the others output zero
        self._counts["samples_short"] += int((~complete).sum())
        keep = (answered & complete[:, None]).to(flat.device)
        masked = expert_scores.masked_fill(~keep, float("-inf"))
        masked = torch.where(keep.any(-1, keepdim=True), masked, torch.zeros_like(masked))  # no NaN rows
        weights = torch.softmax(masked, dim=-1) * keep  # [batch, experts]
        result = None
        for e, idx, out in parts:
            idx = idx.to(flat.device)
            w = weights[idx, e]  # [n]
            contribution = torch.zeros((batch, *out.shape[1:]), dtype=out.dtype, device=flat.device).index_add(
                0, idx, out * w.view(-1, *([1] * (out.dim() - 1)))
            )
            result = contribution if result is None else result + contribution
        if result is None:  # answered.any() above: some part answered
            raise ExpertUnavailableError("no expert answered")
        return result

    def _round(self, flat, choices, assign, need, answered, failed_experts, errors) -> list:
        """One round of calls: expert e gets the samples ``assign[:, e]`` marks. Marks what
        answered in ``answered`` and what failed in ``failed_experts``; returns (expert, sample
        indices, outputs) per call that answered."""
        used = assign.any(0).nonzero().flatten().tolist()
        calls, samples = [], []
        for e in used:
            uid, decl = choices[e]
            calls.append(_Call(
                self.swarm, uid, decl.peer, self.forward_timeout, self.backward_timeout, self.compression,
                backward_follows=torch.is_grad_enabled(), addrs=decl.addrs, stats=self.swarm.calls, guard=self.guard,
                vouches=self.swarm.vouches,
            ))
            samples.append(assign[:, e].nonzero().flatten())
        plan = Round(self, calls, samples, flat.shape[0], need)
        self._counts["calls"] += len(calls)
        try:
            *outs, ok = ParallelCalls.apply(DUMMY, plan, *(flat[idx.to(flat.device)] for idx in samples))
        except NothingAnswered:
            ok, outs = torch.zeros(len(calls), dtype=torch.bool), []
        finally:
            errors.extend(plan.errors)
        parts = []
        for i, e in enumerate(used):
            if ok[i]:
                answered[samples[i], e] = True
                parts.append((e, samples[i], outs[i]))
            else:
                failed_experts.add(e)
        return parts

    def _fail_over(self, flat, choices, assign, need, answered, failed_experts, errors) -> list:
        """The failed experts that have another live replica get their samples again, on that
        replica, once: a leaving or crashed host takes none of its experts out of the step while
        their replicas serve (its failed calls already keep it out of ``_pick_host``)."""
        if not failed_experts:
            return []  # the common case: no lookup, not even of the cache
        live = self.live_experts()
        retry: dict[int, Any] = {}
        for e in sorted(failed_experts):
            uid, tried = choices[e]
            # another replica only: a straggler dropped after k_min is not a failure of its host,
            # and calling that host again would repeat the very call the step gave up on
            others = [d for d in live.get(uid, []) if str(d.peer) != str(tried.peer)]
            other = self._pick_host(uid, others)
            if other is not None:
                retry[e] = other
        if not retry:
            return []
        failed_experts.difference_update(retry)
        self._counts["failed_over"] += len(retry)
        moved = [(uid, retry.get(e, decl)) for e, (uid, decl) in enumerate(choices)]
        again = torch.zeros_like(assign)
        again[:, sorted(retry)] = assign[:, sorted(retry)]
        deficits = [max(0, need - int(n)) for n in answered.sum(-1).tolist()]
        return self._round(flat, moved, again, deficits, answered, failed_experts, errors)

    def extra_repr(self) -> str:
        return f"grid={self.grid_size}, prefix={self.uid_prefix!r}, k_best={self.k_best}, k_min={self.k_min}"


__all__ = ["RemoteMixtureOfExperts"]
