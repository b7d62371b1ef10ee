"""Experts: backends (module + optimizer + schema + checkpoints), the built-in and custom expert
classes, the batching runtime, the tensor wire format and error replies.

The network parts (the server's protocol handler, RemoteExpert, RemoteMixtureOfExperts) build on
these: the handler decodes a request with ``TensorReader``, awaits ``Runtime.forward/backward``
and answers with ``serialize`` or, on failure, ``to_failure``; the client reverses it and calls
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
from .schema import TensorSpec
from .tensors import COMPRESSIONS, TensorReader, deserialize, encode, pick_compression, serialize

__all__ = [
    "COMPRESSIONS",
    "DEFAULT_CONFIG",
    "ExpertBackend",
    "ExpertClass",
    "ExpertStats",
    "ExpertsConfig",
    "FeedForward",
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
