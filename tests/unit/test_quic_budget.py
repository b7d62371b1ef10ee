"""The QUIC transport declares the budget it needs (``quic/budget.py``) and imports nothing of the
resource manager, which satisfies that budget structurally (as yamux's does)."""

from __future__ import annotations

import ast
from pathlib import Path

import trio

from volunteer.net.multiaddr import Multiaddr
from volunteer.net.resources import ResourceLimits, ResourceManager
from volunteer.net.transport.quic import budget
from volunteer.net.transport.quic.transport import QuicTransport

QUIC = Path(budget.__file__).parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports, relative ones resolved against volunteer.net.transport.quic."""
    package = ["volunteer", "net", "transport", "quic"]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found |= {module} | {f"{module}.{alias.name}" for alias in node.names}
    return found


def test_no_quic_module_imports_the_resource_manager():
    offenders = {path.name: sorted(m for m in imported_modules(path) if m.startswith("volunteer.net.resources"))
                 for path in QUIC.glob("*.py")}
    assert {name: found for name, found in offenders.items() if found} == {}
    # the resolver sees a relative import as the absolute one it is
    assert "volunteer.net.limits" in imported_modules(QUIC / "settings.py")


async def test_the_transport_takes_handshake_slots_from_the_budget_handed_in():
    manager = ResourceManager(ResourceLimits(address_pending_handshakes=1))
    with trio.fail_after(5):  # the slot reads the trio clock; nothing here waits
        await trio.sleep(0)
    transport = QuicTransport(handshakes=manager)
    first = transport._handshake_slot(("192.0.2.7", 4001))
    assert first is not None
    assert transport._handshake_slot(("192.0.2.7", 4002)) is None  # that address's one slot is taken
    assert manager.refusals()["address"]["pending_handshakes"] == 1
    first()
    assert transport._handshake_slot(("192.0.2.7", 4003)) is not None


async def test_without_a_budget_handshakes_are_not_accounted():
    with trio.fail_after(5):
        await trio.sleep(0)
    transport = QuicTransport()
    release = transport._handshake_slot(("192.0.2.7", 4001))
    assert release is not None
    release()


def test_the_budget_names_only_what_the_resource_manager_offers():
    manager = ResourceManager(ResourceLimits())
    scope = manager.open_connection("peer", Multiaddr("/ip4/192.0.2.7/udp/4001/quic-v1"), now=0.0)
    assert scope is not None
    for protocol, subject in ((budget.HandshakeSlots, manager), (budget.ConnectionBudget, scope)):
        for name in protocol.__dict__:
            if not name.startswith("_") and callable(protocol.__dict__[name]):
                assert callable(getattr(subject, name)), (protocol.__name__, name)
    stream = scope.open_stream(True, now=0.0)
    assert stream is not None
    for name in ("reserve_memory", "release_memory", "close"):
        assert callable(getattr(stream, name))
