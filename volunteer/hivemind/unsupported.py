"""hivemind RPCs we do not serve, answered on the wire with a clear error instead of silence.

hivemind's averagers (``DecentralizedAverager`` and its subclasses in ``hivemind.optim``) serve
``rpc_join_group``, ``rpc_aggregate_part`` and ``rpc_download_state``, all stream calls, named
``[namespace::]ClassName.rpc_method`` with the averager's prefix as namespace. A hivemind peer that
asks a volunteer node for any of them gets one error frame saying volunteer does not support
hivemind averaging (its client raises it as ``P2PHandlerError``), not a hang or a bare
"protocol not supported".

The Host matches protocol names exactly, so the refusals are registered for the bare names and for
each namespace we are told about (``refuse_namespace``); a namespace nobody told us of gets the
Host's multistream "na", which hivemind reports as an error too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

import trio

from ..net.connection import NetStream
from ..net.service import BaseService, Handler, HostAPI
from .framing import encode_error
from .rpc import drain

# hivemind 1.1's averager classes (their class name is part of the protocol id) and their RPCs.
AVERAGER_CLASSES = (
    "DecentralizedAverager",
    "TrainingAverager",
    "TrainingStateAverager",
    "GradientAverager",
    "PowerSGDGradientAverager",
)
AVERAGER_METHODS = ("rpc_join_group", "rpc_aggregate_part", "rpc_download_state")
# how long a refused caller may keep sending before we close on it
REFUSAL_DRAIN_TIMEOUT = 5.0


def averaging_protocols(namespace: str | None = None) -> list[str]:
    """The protocol ids of hivemind averaging under ``namespace`` (None: the bare names)."""
    prefix = f"{namespace}::" if namespace else ""
    return [f"{prefix}{cls}.{method}" for cls in AVERAGER_CLASSES for method in AVERAGER_METHODS]


def refusal_message(protocol: str) -> str:
    """What a hivemind caller of ``protocol`` reads."""
    return (
        f"{protocol}: hivemind averaging is not supported by volunteer "
        "(this peer serves the hivemind DHT and mixture-of-experts RPCs only)"
    )


class HivemindRefusals(BaseService):
    """Answers hivemind's averaging RPCs (bare, and under ``namespaces``) with a clear error frame."""

    def __init__(self, namespaces: Iterable[str] = ()) -> None:
        self.namespaces = list(namespaces)
        self.refused: Counter[str] = Counter()  # protocol → calls refused
        self._host: HostAPI | None = None  # set once running: a namespace learnt before is ignored

    def handlers(self) -> Mapping[str, Handler]:
        names = averaging_protocols() + [p for ns in self.namespaces for p in averaging_protocols(ns)]
        return {name: self._refuse for name in names}

    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._host = host
        task_status.started()

    def refuse_namespace(self, namespace: str) -> None:
        """Also refuse averaging under ``namespace`` (an averager prefix learnt later)."""
        if self._host is None or namespace in self.namespaces:
            return
        self.namespaces.append(namespace)
        for name in averaging_protocols(namespace):
            self._host.set_handler(name, self._refuse)

    async def _refuse(self, stream: NetStream) -> None:
        protocol = stream.protocol or "?"
        self.refused[protocol] += 1
        # answer first: hivemind's stream caller reads while it writes, so it hears us at once
        await stream.send_all(encode_error(refusal_message(protocol)))
        await stream.send_eof()
        await drain(stream, timeout=REFUSAL_DRAIN_TIMEOUT)
        await stream.aclose()


__all__ = ["AVERAGER_CLASSES", "AVERAGER_METHODS", "HivemindRefusals", "averaging_protocols", "refusal_message"]
