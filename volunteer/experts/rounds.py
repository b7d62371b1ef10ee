"""One round of a mixture's expert calls (``moe.py`` decides who gets which samples; this runs it).

Each chosen expert gets one call with all the samples that chose it, all calls in parallel in the
swarm's trio loop (one hop to it for the whole round); once every sample has its ``need``
answers, stragglers get ``timeout_after_k_min`` more and are dropped. ``ParallelCalls`` makes a
round one autograd node: backward goes only to the calls that answered forward, each to the host
that ran it, with only the gradients (the volunteers kept the forward's inputs). A rejected
backward reply (the guard caught a lie, or its host was excluded since) is asked of another
replica (``Mixture._backward_elsewhere``); any other failed backward only loses that gradient.

The round reports each answer, failure and rejection to the mixture it serves, through the
``Mixture`` protocol declared here (its back-off, latency, trust and audit bookkeeping stay the
mixture's).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import torch
import trio

from ..errors import (
    ExpertBackwardRefusedError,
    ExpertError,
    ExpertExcludedError,
    ExpertReplyRejected,
    ExpertTimeoutError,
    RemoteExpertError,
    describe,
)
from .audit import Auditor
from .callstats import CallReport
from .client import _Call, detached_cpu
from .directory import TrainerSwarm

log = logging.getLogger(__name__)


class Mixture(Protocol):
    """What a round asks of the mixture it serves (``RemoteMixtureOfExperts``): its swarm's loop,
    the straggler cutoff, and the bookkeeping each call's outcome goes to."""

    swarm: TrainerSwarm
    timeout_after_k_min: float
    _auditor: Auditor
    _refused_by: set[str]  # volunteers that refused our backwards (told once each)

    def _answered(self, call: _Call, seconds: float | None = None) -> None: ...

    def _failed(self, call: _Call, error: BaseException | None = None) -> None: ...

    def _rejected(self, call: _Call, inputs: torch.Tensor | None, error: ExpertReplyRejected,
                  receipt: Any = None) -> None: ...

    async def _backward_elsewhere(self, call: _Call, inputs: torch.Tensor,
                                  grad: torch.Tensor) -> torch.Tensor | None: ...


class NothingAnswered(Exception):
    """No call of a round answered (the mixture decides whether that is fatal)."""


def worst_error(errors: list[BaseException]) -> BaseException:
    """The error that explains most: a remote exception, then a timeout, then unreachable."""
    for kind in (RemoteExpertError, ExpertTimeoutError, ExpertError):
        for error in errors:
            if isinstance(error, kind):
                return error
    return errors[0]


class Round:
    """One round of a batch's expert calls: who gets which samples; runs them in the swarm's loop."""

    def __init__(self, mixture: Mixture, calls: list[_Call], samples: list[torch.Tensor], batch: int,
                 need: list[int]) -> None:
        self.mixture, self.calls, self.samples, self.batch, self.need = mixture, calls, samples, batch, need
        self.errors: list[BaseException] = []
        self.reports = [CallReport() for _ in calls]  # forward: each keeps the key of its kept inputs
        self.audits: dict[int, Any] = {}  # call index -> its audit case, which needs its backward

    async def forward_all(self, inputs: list[torch.Tensor]) -> list[list[torch.Tensor] | None]:
        # one hop to the trio thread for the whole round; each call records its host's declared
        # addresses there before it dials
        results: list[list[torch.Tensor] | None] = [None] * len(self.calls)
        answers = [0] * self.batch
        satisfied = trio.Event()
        finished = 0

        async with trio.open_nursery() as nursery:

            async def one(i: int) -> None:
                nonlocal finished
                try:
                    started = time.monotonic()
                    outputs = results[i] = await self.calls[i].forward([inputs[i]], self.reports[i])
                    self.mixture._answered(self.calls[i], time.monotonic() - started)
                    self.audits[i] = self.mixture._auditor.answered(
                        self.calls[i], inputs[i], outputs, self.reports[i].compression, self.reports[i].receipt)
                    for b in self.samples[i].tolist():
                        answers[b] += 1
                    if all(a >= n for a, n in zip(answers, self.need)):
                        satisfied.set()
                except ExpertError as exc:
                    self.errors.append(exc)
                    self.mixture._failed(self.calls[i], exc)
                    if isinstance(exc, ExpertReplyRejected):
                        self.mixture._rejected(self.calls[i], inputs[i], exc, self.reports[i].receipt)
                finally:
                    finished += 1
                    if finished == len(self.calls):
                        nursery.cancel_scope.cancel()  # every call ended: nothing left to wait for

            async def cutoff() -> None:
                await satisfied.wait()
                await trio.sleep(self.mixture.timeout_after_k_min)
                nursery.cancel_scope.cancel()  # k_min answered for every sample: drop the stragglers

            for i in range(len(self.calls)):
                nursery.start_soon(one, i)
            nursery.start_soon(cutoff)
        return results

    async def backward_all(self, inputs: list[torch.Tensor], grads: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        out: list[torch.Tensor | None] = [None] * len(self.calls)

        async def one(i: int, grad: torch.Tensor) -> None:
            report = CallReport()
            rejected = False
            try:
                out[i] = (await self.calls[i].backward([inputs[i]], [grad], self.reports[i].kept, report))[0]
            except ExpertError as exc:
                # a lie seen in this reply, or in another of its host's since its forward
                rejected = isinstance(exc, (ExpertReplyRejected, ExpertExcludedError))
                if isinstance(exc, ExpertBackwardRefusedError) and str(self.calls[i].peer) not in self.mixture._refused_by:
                    # a volunteer that does not take our gradients (not admitted, or refused for
                    # them): one line per volunteer, the rest at info like any dropped gradient
                    self.mixture._refused_by.add(str(self.calls[i].peer))
                    log.warning("volunteer %s refuses our backwards: %s", str(self.calls[i].peer)[-8:], describe(exc))
                log.info("backward to %s failed, its gradient is dropped: %s", self.calls[i].uid, describe(exc))
                self.mixture._failed(self.calls[i], exc)
                if isinstance(exc, ExpertReplyRejected):
                    self.mixture._rejected(self.calls[i], None, exc)
            finally:
                self.mixture._auditor.backward_sent(self.audits.pop(i, None), grad, out[i], report.compression,
                                                report.receipt)
            if rejected:  # a lie in the gradient costs the step nothing while another replica serves
                out[i] = await self.mixture._backward_elsewhere(self.calls[i], inputs[i], grad)

        async with trio.open_nursery() as nursery:
            for i, grad in enumerate(grads):
                if grad is not None:
                    nursery.start_soon(one, i, grad)
        for case in self.audits.values():  # audited calls that got no gradient: no backward
            self.mixture._auditor.backward_sent(case, None, None)
        self.audits.clear()
        return out


class ParallelCalls(torch.autograd.Function):
    """A round as one autograd node: its forward runs every call at once in the swarm's loop and
    returns each call's outputs (zeros where it failed) and a mask of those that answered; its
    backward sends each answered call's gradient back to the host that computed it."""

    @staticmethod
    def forward(ctx, dummy: torch.Tensor, plan: Round, *xs: torch.Tensor):
        results = plan.mixture.swarm.loop.run(plan.forward_all, detached_cpu(xs))
        answered = [r is not None for r in results]
        ctx.plan, ctx.answered, ctx.device = plan, answered, xs[0].device
        template = next((r[0] for r in results if r is not None), None)
        if template is None:
            raise NothingAnswered()
        outs = [
            (r[0] if r is not None else torch.zeros((len(plan.samples[i]), *template.shape[1:]), dtype=template.dtype)).to(ctx.device)
            for i, r in enumerate(results)
        ]
        ctx.save_for_backward(*xs)
        mask = torch.tensor(answered, dtype=torch.bool)
        ctx.mark_non_differentiable(mask)
        return (*outs, mask)

    @staticmethod
    def backward(ctx, *grads):
        xs = ctx.saved_tensors
        grads = [g.detach().cpu().contiguous() if (g is not None and ok) else None for g, ok in zip(grads[:-1], ctx.answered)]
        got = ctx.plan.mixture.swarm.loop.run(ctx.plan.backward_all, detached_cpu(xs), grads)
        return (None, None, *((g.to(ctx.device) if g is not None else torch.zeros_like(x)) for g, x in zip(got, xs)))


__all__ = ["Mixture", "NothingAnswered", "ParallelCalls", "Round", "worst_error"]
