"""The standard libp2p stack: the services a node's Host runs, listed in one place, and one call
that opens a Host with them.

The Host (``host.py``) runs exactly the services it is handed; this module, at the top of the net
floor, is where they are chosen, the way rust-libp2p's dcutr example lists its behaviours in one
struct:

    TCP, memory    the transports the Host dials and listens with (``StackOptions.tcp``,
                   ``StackOptions.memory``: the in-process network tests and benchmarks use)
    stream pool    pooled request/reply streams (the DHT, the experts)
    identify       who a peer is, and where it sees us
    ping           round-trip times
    QUIC           `/udp/N/quic-v1` dialling and listening on one UDP socket per address family,
                   which also carries hole-punch packets (``StackOptions.quic``)
    perf           `/perf/1.0.0`, bounded per peer (``StackOptions.perf``)
    relay client   dial and accept circuit-relay-v2 connections (``StackOptions.relay_client``)
    address observer, hole puncher
                   the addresses peers see us at, and DCUtR over them (``StackOptions.hole_punching``)
    port mapper    asks the home router (PCP, NAT-PMP, UPnP IGD) to forward our listen ports and
                   advertises a mapping once AutoNAT reached it (``StackOptions.port_mapping``)

    async with open_stack(keypair, ["/ip4/0.0.0.0/tcp/4001"], services=[my_service]) as host:
        ...

Roots call this (``open_volunteer``, ``Swarm``, the relay node, the CLI's network commands,
benchmarks, tests); tests of the Host itself use ``open_host`` directly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
import os
from dataclasses import dataclass, field

from .config import HostConfig
from .host import Host, install_resource_manager, open_host
from .identify import Identify
from .identity import KeyPair
from .lossy_paths import LossyPathRepair
from .multiaddr import Multiaddr
from .nat.dcutr import HolePuncher
from .nat.observer import AddressObserver
from .nat.portmap import PortMapper
from .nat.relay_client import RelayClient
from .perf import PerfLimits, PerfServer
from .ping import Ping
from .pool import StreamPool
from .resources import ResourceManager
from .service import Service
from .transport.base import Transport
from .transport.memory import MemoryTransport
from .transport.quic import QuicLimits, QuicTransport
from .transport.tcp import TcpTransport


@dataclass(frozen=True)
class StackOptions:
    """Which of the optional standard services run, and with what options."""

    # Dial and listen on /ip4|ip6/…/tcp/N addresses.
    tcp: bool = True
    # Dial and listen on /memory/N addresses of the process-wide in-memory network.
    memory: bool = True
    # Ask every new connection's peer who it is (identify); off, a peer is identified on request.
    identify_on_connect: bool = True
    # Dial and listen on /udp/N/quic-v1 within these bounds (listen on such an address to serve
    # it; aioquic loads only then); None: no QUIC.
    quic: QuicLimits | None = field(default_factory=QuicLimits)
    # Serve /perf/1.0.0 within these bounds so anyone can measure a link to us; None: no perf server.
    perf: PerfLimits | None = field(default_factory=PerfLimits)
    # Dial …/p2p-circuit/p2p/PEER addresses and accept connections relayed to us (circuit relay v2).
    relay_client: bool = True
    # Run DCUtR: upgrade relayed connections to direct, hole-punched ones (with the address
    # observer that tells the puncher where peers see us).
    hole_punching: bool = True
    # Ask the home router to forward our IPv4 listen ports (PCP, NAT-PMP, UPnP IGD). Off when
    # VOLUNTEER_NO_PORT_MAPPING=1 unless set here: a machine-wide switch (test suites keep their
    # daemons from talking to the real router with it).
    port_mapping: bool = field(default_factory=lambda: os.environ.get("VOLUNTEER_NO_PORT_MAPPING") != "1")
    # Open a QUIC connection (with repair datagrams) beside a TCP connection that loses packets,
    # and move new streams there (net/lossy_paths.py). Needs ``quic``.
    lossy_path_repair: bool = True


def standard_transports(options: StackOptions | None = None) -> list[Transport]:
    """The transports the Host is handed (new instances): TCP and memory as ``options`` enable
    them. QUIC is a service (``standard_services``): it adds its transport once its socket runs."""
    options = options or StackOptions()
    transports: list[Transport] = []
    if options.tcp:
        transports.append(TcpTransport())
    if options.memory:
        transports.append(MemoryTransport())
    return transports


def standard_services(options: StackOptions | None = None, resources: ResourceManager | None = None) -> list[Service]:
    """The standard services, new instances, as ``options`` (default: all of them) enable them;
    ``resources`` is handed to those that account with it (QUIC's handshake slots)."""
    options = options or StackOptions()
    services: list[Service] = [StreamPool(), Identify(identify_on_connect=options.identify_on_connect), Ping()]
    if options.quic is not None:
        services.append(QuicTransport(options.quic, handshakes=resources))
        if options.lossy_path_repair:
            services.append(LossyPathRepair())
    if options.perf is not None:
        services.append(PerfServer(options.perf))
    if options.relay_client:
        services.append(RelayClient())
    if options.hole_punching:
        services += [AddressObserver(), HolePuncher()]
    if options.port_mapping:
        services.append(PortMapper())
    return services


@asynccontextmanager
async def open_stack(
    keypair: KeyPair | None = None,
    listen: Sequence[Multiaddr | str] = (),
    *,
    options: StackOptions | None = None,
    services: Sequence[Service] = (),
    transports: Sequence[Transport] | None = None,
    config: HostConfig | None = None,
) -> AsyncIterator[Host]:
    """Run a Host with the standard services (as ``options`` enable them) and ``services`` for the
    duration of the ``async with`` block. A service given here replaces the standard one of its
    type (an ``Identify`` of your own, say); the rest go to ``open_host`` unchanged. ``transports``
    replaces the standard ones (TCP and memory, as ``options`` enable them)."""
    given = list(services)
    resources = install_resource_manager(given, config or HostConfig())  # the given one, or the Host's default
    standard = [s for s in standard_services(options, resources) if not any(isinstance(o, type(s)) for o in given)]
    chosen = list(transports) if transports is not None else standard_transports(options)
    async with open_host(keypair, listen, transports=chosen, config=config, services=standard + given) as host:
        yield host


__all__ = ["StackOptions", "open_stack", "standard_services", "standard_transports"]
