"""The records the expert runtime shares between the event loop and its worker thread, and how a
computed batch gives each request its rows back."""

from __future__ import annotations

import enum
from typing import Any, Callable, Sequence

import torch

from ..errors import LocalProtocolError
from .schema import signature


class Kind(enum.Enum):
    """What a request or a job asks of the runtime (and, with an expert's uid, a cost key)."""

    FORWARD = "forward"
    BACKWARD = "backward"
    STEP = "step"  # the optimizer step a backward owes (never submitted: the runtime owes it)
    JOB = "job"  # a function run between batches (``Runtime.run_sync``, ``Runtime.run_on``)
    AVERAGE = "average"  # a sync round's average written into an expert (``Runtime.run_on``)

    # Members are singletons compared by identity: hashed by identity too, in C. Enum's own
    # __hash__ is Python, and a call looks kinds up in sets and dicts about ten times.
    __hash__ = object.__hash__


BATCH_KINDS = frozenset({Kind.FORWARD, Kind.BACKWARD})  # requests that queue and batch per expert
JOB_KINDS = frozenset({Kind.JOB, Kind.AVERAGE})  # functions that run one at a time, in arrival order


class Request:
    """One caller's request, shared between the trio side and the worker.

    A forward or backward carries tensors; a job carries ``work``, the function to call. ``waiter``
    is whatever the caller waits on (a ``trio.Event``): the runtime calls its ``set()``."""

    __slots__ = (
        "uid", "kind", "inputs", "grads", "batch", "key", "nbytes", "submitted", "waiter", "work",
        "result", "error", "gone", "keep_graph", "settle_later", "trainer", "check", "stamp",
    )

    def __init__(
        self,
        uid: str,
        kind: Kind,
        inputs: Sequence[torch.Tensor] = (),
        grads: Sequence[torch.Tensor] | None = None,
        *,
        batch: int = 0,
        waiter: Any = None,
        work: Callable[[], Any] | None = None,
        keep_graph: bool = False,
        settle_later: bool = False,
        trainer: Any = None,
    ) -> None:
        self.uid, self.kind = uid, kind
        self.inputs = list(inputs)
        self.grads = None if grads is None else list(grads)
        self.batch = batch
        self.nbytes = nbytes(self.inputs) + (nbytes(self.grads) if self.grads is not None else 0)
        self.key = signature(self.inputs)  # requests batch together only when these agree
        self.submitted = 0.0  # stamped by the scheduler when it takes the request
        self.waiter = waiter
        self.work = work
        self.result: Any = None
        self.error: BaseException | None = None
        self.gone = False  # the caller stopped waiting (cancelled)
        self.keep_graph = keep_graph  # a forward whose backward the caller announced
        self.settle_later = settle_later  # a backward whose caller calls Runtime.apply_owed_steps
        self.trainer = trainer  # who sent it (a peer ID; None: this process), for trainers.TrainerBook
        self.check: Any = None  # a computed backward: the gradient bound's verdict (gradbound.Check)
        self.stamp: Any = None  # computed: (snapshots.Stamp of the state, rows computed together)

    def __repr__(self) -> str:
        return f"Request({self.kind.value} {self.uid!r} batch={self.batch})"

    def gradients(self) -> list[torch.Tensor]:
        """A backward's output gradients (every backward carries them)."""
        if self.grads is None:
            raise LocalProtocolError(f"{self!r} carries no gradients")
        return self.grads

    def job(self) -> Callable[[], Any]:
        """A job's function (every job carries one)."""
        if self.work is None:
            raise LocalProtocolError(f"{self!r} carries no work")
        return self.work


def wake(requests: Sequence[Request]) -> None:
    """Wake the waiters of ``requests`` (on the event loop)."""
    for request in requests:
        request.waiter.set()


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes the tensors hold."""
    return sum(t.nelement() * t.element_size() for t in tensors)


def hand_out(batch: list[Request], outputs: list[torch.Tensor]) -> None:
    """Give each request of a computed batch its rows of ``outputs`` (split along the batch dim)."""
    if len(batch) == 1:
        batch[0].result = outputs
        return
    parts = [torch.split(tensor, [r.batch for r in batch]) for tensor in outputs]
    for index, request in enumerate(batch):
        request.result = [part[index] for part in parts]


def concat(requests: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Each position's tensors of several requests, concatenated along the batch dim."""
    if len(requests) == 1:
        return requests[0]
    return [torch.cat(parts) for parts in zip(*requests)]
