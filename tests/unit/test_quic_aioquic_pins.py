"""Pins what ``quic/aioquic_adapter.py`` takes of aioquic beyond its public interface: each private
name it lists exists and is of the kind it uses, the loss detection it redoes is still aioquic's,
and no QUIC module assigns a module global of aioquic's (the thresholds are per connection).
An aioquic upgrade that moves any of these fails here, by name."""

from __future__ import annotations

import ast
import hashlib
import inspect
from dataclasses import replace
from pathlib import Path

import aioquic
import pytest
from aioquic import tls
from aioquic.quic import recovery as aioquic_recovery
from aioquic.quic.congestion.base import QuicCongestionControl
from aioquic.quic.congestion.cubic import CubicCongestionControl
from aioquic.quic.congestion.reno import RenoCongestionControl
from aioquic.quic.connection import QuicConnection
from aioquic.quic.recovery import QuicPacketPacer, QuicPacketRecovery
from aioquic.quic.stream import QuicStreamSender

from volunteer.net.transport.quic import aioquic_adapter
from volunteer.net.transport.quic.aioquic_adapter import PRIVATE_NAMES
from volunteer.net.transport.quic.repair import BLOCK_SIZE

from .test_quic_core import LIMITS, engines, exchange

# aioquic 1.7.2's QuicPacketRecovery._detect_loss, which aioquic_adapter.detect_loss redoes with
# its thresholds as arguments: when this changes, compare the two again and pin the new one.
DETECT_LOSS_SHA256 = "56e5a246bb22cb691b706a288bbfebe50b2b0eb09710c3d382233f16108c77fa"
CLASSES = {"QuicConnection": QuicConnection, "QuicPacketRecovery": QuicPacketRecovery,
           "QuicPacketPacer": QuicPacketPacer, "QuicCongestionControl": QuicCongestionControl,
           "tls.Context": tls.Context, "QuicStreamSender": QuicStreamSender}


def live_instances() -> dict[str, list[object]]:
    """Instances of each class after a handshake and some stream data (attributes are set in
    ``__init__`` or on the way, so only live objects can show them)."""
    client, server = engines()
    exchange(client, server)
    stream_id = client.get_next_available_stream_id()
    client.send_stream_data(stream_id, b"x" * 5000)
    sender = QuicConnection._get_or_create_stream_for_send(client, stream_id).sender
    return {
        "QuicConnection": [client, server],
        "QuicPacketRecovery": [client._loss],
        "QuicPacketPacer": [QuicPacketPacer(max_datagram_size=1200)],
        "QuicCongestionControl": [RenoCongestionControl(max_datagram_size=1200), CubicCongestionControl(max_datagram_size=1200)],
        "tls.Context": [client.tls, server.tls],
        "QuicStreamSender": [sender],
    }


def test_the_pinned_aioquic_is_the_one_installed():
    assert aioquic.__version__ == "1.7.2"


@pytest.mark.parametrize("where,name,kind", PRIVATE_NAMES, ids=[f"{w}.{n}" for w, n, _ in PRIVATE_NAMES])
def test_each_private_name_the_adapter_uses_exists(where, name, kind):
    cls = CLASSES[where]
    if kind == "method":
        assert callable(getattr(cls, name, None)), f"aioquic {where}.{name} is no longer a method"
    else:
        for instance in live_instances()[where]:
            assert hasattr(instance, name), f"aioquic {type(instance).__name__}.{name} is gone"


def test_the_overridden_methods_keep_their_signatures():
    expected = {
        "_initialize": ["self", "peer_cid"],
        "_parse_transport_parameters": ["self", "data", "from_session_ticket"],
        "_write_connection_limits": ["self", "builder", "space"],
        "_write_stream_limits": ["self", "builder", "space", "stream"],
    }
    for name, parameters in expected.items():
        assert list(inspect.signature(getattr(QuicConnection, name)).parameters) == parameters, name
    assert list(inspect.signature(QuicPacketRecovery._detect_loss).parameters) == ["self", "now", "space"]
    on_lost = inspect.signature(QuicPacketRecovery._on_packets_lost).parameters  # keyword-only, as called
    assert {"now", "packets", "persistent_congestion", "space"} <= set(on_lost)
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for name, p in on_lost.items() if name != "self")


def test_the_loss_detection_redone_is_aioquics():
    source = inspect.getsource(QuicPacketRecovery._detect_loss)
    assert hashlib.sha256(source.encode()).hexdigest() == DETECT_LOSS_SHA256
    assert (aioquic_recovery.K_PACKET_THRESHOLD, aioquic_recovery.K_TIME_THRESHOLD) == (3, 9 / 8)
    assert (aioquic_adapter.PACKET_THRESHOLD, aioquic_adapter.TIME_THRESHOLD) == (3, 9 / 8)


@pytest.mark.parametrize("congestion", ["cubic", "ours"])
def test_loss_thresholds_are_per_connection_and_aioquics_globals_stay(congestion):
    tolerant, _ = engines(quic_limits=replace(LIMITS, congestion=congestion))
    plain, _ = engines(quic_limits=replace(LIMITS, congestion=congestion))
    tolerant.congestion.tolerate(True)
    assert tolerant.loss_thresholds() == (3 + BLOCK_SIZE, 5 / 4)
    assert plain.loss_thresholds() == (3, 9 / 8)
    for engine in (tolerant, plain):  # each detects with its own, through its own loss detector
        for space in engine._loss.spaces:
            engine._loss._detect_loss(now=1.0, space=space)
    assert (aioquic_recovery.K_PACKET_THRESHOLD, aioquic_recovery.K_TIME_THRESHOLD) == (3, 9 / 8)
    assert QuicPacketRecovery.__dict__["_detect_loss"].__module__ == "aioquic.quic.recovery"


def test_no_quic_module_assigns_anything_of_aioquics_modules():
    """Only objects a connection owns may be changed; an aioquic module's names never."""
    for path in Path(aioquic_adapter.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        modules = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aioquic"):
                modules |= {alias.asname or alias.name for alias in node.names if alias.name[0].islower()}
            elif isinstance(node, ast.Import):
                modules |= {alias.asname or alias.name.split(".")[0] for alias in node.names if alias.name.startswith("aioquic")}
        for node in ast.walk(tree):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name):
                        assert part.value.id not in modules, f"{path.name}:{node.lineno} assigns {part.value.id}.{part.attr}"


def test_only_the_adapter_reaches_private_names_of_aioquic():
    """Every other QUIC module uses aioquic's public names only (or none)."""
    for path in Path(aioquic_adapter.__file__).parent.glob("*.py"):
        if path.name == "aioquic_adapter.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("aioquic"):
                assert not any(alias.name.startswith("_") for alias in node.names), (path.name, node.module)
                assert not any(part.startswith("_") for part in node.module.split(".")), (path.name, node.module)
