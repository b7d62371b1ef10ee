"""The records the expert runtime shares between the event loop and its worker thread, and how
they group into batches and get their share of a batch's outputs back."""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Iterable, Sequence

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


def take_batch(
    queues: Iterable[Queue], now: float, *, min_batch_size: int, max_batch_size: int, batch_window: float, closing: bool
) -> tuple[list[Request], float | None]:
    """The next batch, taken out of its queue: from the ready queue (``min_batch_size`` samples
    waiting, or its oldest request ``batch_window`` old, or ``closing``) whose oldest request is
    oldest, the requests of that request's sizes, oldest first, up to ``max_batch_size`` samples.
    None ready: ``[]`` and the seconds until one is (None if no queue holds a request)."""
    best, wait = None, None
    for queue in queues:
        if not queue.requests:
            continue
        head = queue.requests[0]
        due = head.submitted + batch_window
        if queue.samples >= min_batch_size or now >= due or closing:
            if best is None or head.submitted < best.requests[0].submitted:
                best = queue
        else:
            wait = due - now if wait is None else min(wait, due - now)
    if best is None:
        return [], wait
    head = best.requests[0]
    batch: list[Request] = []
    kept: deque[Request] = deque()
    samples = 0
    for request in best.requests:
        if request.key == head.key and samples + request.batch <= max_batch_size:
            batch.append(request)
            samples += request.batch
        else:
            kept.append(request)
    best.requests = kept
    best.samples -= samples
    return batch, None


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
