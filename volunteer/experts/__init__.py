"""Experts: backends (module + optimizer + schema + checkpoints), the built-in and custom expert
classes, the batching runtime, the tensor wire format and error replies.

The network parts (``server``, ``client``, ``moe``, ``loop``, ``protocol``) build on these: the
handler decodes a request with ``TensorReader``, awaits ``Runtime.forward/backward`` and answers
with ``serialize`` or, on failure, ``to_failure``; the client reverses it and calls
``raise_remote`` on an error reply.
"""

from .backend import ExpertBackend, make_backend, resolve_device
from .config import DEFAULT_CONFIG, ExpertsConfig
from .failures import from_failure, raise_remote, to_failure
from .layers import (
    ExpertClass,
    FeedForward,
    TransformerBlock,
    expert_classes,
    get_expert_class,
    load_expert_file,
    register_expert,
)
from .runtime import ExpertStats, Runtime, open_runtime

# the network half: protocol framing, the server's handler, the client side and the mixture
from .client import RemoteExpert, call_expert
from .loop import BackgroundLoop
from .moe import RemoteMixtureOfExperts
from .protocol import protocol_id
from .server import ExpertServer
from .schema import TensorSpec
from .tensors import COMPRESSIONS, TensorReader, deserialize, encode, pick_compression, serialize

# what a trainer checks in every reply, and how far it trusts each volunteer
from .comparison import AuditConfig
from .guard import GuardConfig, ReplyGuard
from .trust import Standing, TrustLedger, TrustPolicy

__all__ = [
    "AuditConfig",
    "BackgroundLoop",
    "ExpertServer",
    "RemoteExpert",
    "RemoteMixtureOfExperts",
    "ReplyGuard",
    "Standing",
    "TrustLedger",
    "TrustPolicy",
    "call_expert",
    "protocol_id",
    "COMPRESSIONS",
    "DEFAULT_CONFIG",
    "ExpertBackend",
    "ExpertClass",
    "ExpertStats",
    "ExpertsConfig",
    "FeedForward",
    "GuardConfig",
    "Runtime",
    "TensorReader",
    "TensorSpec",
    "TransformerBlock",
    "deserialize",
    "encode",
    "expert_classes",
    "from_failure",
    "get_expert_class",
    "load_expert_file",
    "make_backend",
    "open_runtime",
    "pick_compression",
    "raise_remote",
    "register_expert",
    "resolve_device",
    "serialize",
    "to_failure",
]
