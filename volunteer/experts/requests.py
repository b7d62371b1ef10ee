"""The records the expert runtime shares between the event loop and its worker thread."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Sequence

import torch
import trio

from .schema import signature


class Request:
    """One caller's request, shared between the trio side and the worker."""

    __slots__ = ("uid", "kind", "inputs", "grads", "batch", "key", "nbytes", "submitted", "event", "result", "error", "gone", "keep_graph", "settle_later")

    def __init__(self, uid: str, kind: str, inputs, grads, batch: int, nbytes: int) -> None:
        self.uid, self.kind, self.inputs, self.grads = uid, kind, inputs, grads
        self.batch, self.nbytes = batch, nbytes
        self.key = signature(inputs)  # requests batch together only when these agree
        self.submitted = time.perf_counter()
        self.event = trio.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.gone = False  # the caller stopped waiting (cancelled)
        self.keep_graph = False  # a forward whose backward the caller announced
        self.settle_later = False  # a backward whose caller calls Runtime.apply_owed_steps


class Queue:
    """One expert's queue of one kind (forward or backward): requests and their samples."""

    __slots__ = ("requests", "samples")

    def __init__(self) -> None:
        self.requests: deque[Request] = deque()
        self.samples = 0


def wake(requests: list[Request]) -> None:
    """Wake the waiters of ``requests`` (on the event loop)."""
    for request in requests:
        request.event.set()


def nbytes(tensors: Sequence[torch.Tensor]) -> int:
    """Bytes the tensors hold."""
    return sum(t.nelement() * t.element_size() for t in tensors)


def concat(requests: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Each position's tensors of several requests, concatenated along the batch dim."""
    if len(requests) == 1:
        return requests[0]
    return [torch.cat(parts) for parts in zip(*requests)]
