"""The QUIC transport (`/ip4|ip6/…/udp/N/quic-v1`): a Transport the Host dials and listens
through, and a Service that owns its UDP endpoints.

QUIC brings its own security (TLS 1.3 with libp2p certificates) and multiplexing, so a QUIC
``RawConnection`` arrives already upgraded: it carries its ``QuicSession`` and the Host skips
Noise and yamux. Listening binds the shared endpoint of that address family; dials leave from it
(the source port is the advertised one, which hole punching and observed addresses rely on), or
from a throw-away socket when asked for another port (AutoNAT's dial-back) or when we do not
listen.

Nothing here loads aioquic or builds a certificate when the Host starts: a Host that listens on
QUIC starts as fast as one that does not. Listening loads them in a worker thread (``_load``),
so the event loop keeps running meanwhile (importing aioquic takes most of a second on a busy
machine); a dial waits for that load the same way.
"""

from __future__ import annotations

import errno
import socket
import time

import trio

from typing import TYPE_CHECKING, Any

from ....errors import MultiaddrError
from ... import limits
from ...multiaddr import Multiaddr
from ...service import BaseService, HostAPI
from ..base import InboundHandler, RawConnection
from .budget import HandshakeSlots
from .demux import Admission
from .endpoint import Address, UdpEndpoint, open_udp_socket
from .settings import QuicLimits

if TYPE_CHECKING:
    from ...identity import KeyPair
    from ...tls import Certificate
    from .session import QuicSession

HOSTS = ("ip4", "ip6", "dns", "dns4", "dns6")


def quic_endpoint(addr: Multiaddr) -> tuple[str, int]:
    """(host, port) of /ip4|ip6|dns…/H/udp/N/quic-v1[/p2p/ID]; MultiaddrError for anything else."""
    if not is_quic(addr):
        raise MultiaddrError(f"{addr} is not a QUIC address")
    return addr.value_at(0), int(addr.value_at(1))


def is_quic(addr: Multiaddr) -> bool:
    """Whether ``addr`` is a direct QUIC v1 address (optionally with /p2p/ID)."""
    names = addr.protocols()
    return (
        len(names) >= 3 and names[0] in HOSTS and names[1] == "udp" and names[2] == "quic-v1"
        and (len(names) == 3 or (len(names) == 4 and names[3] == "p2p"))
    )


def quic_multiaddr(sockaddr: Address) -> Multiaddr:
    """The /ip4|ip6/H/udp/N/quic-v1 multiaddr of a socket address."""
    host, port = str(sockaddr[0]), int(sockaddr[1])
    if host.startswith("::ffff:") and "." in host:
        host = host[7:]
    family = "ip6" if ":" in host else "ip4"
    return Multiaddr(f"/{family}/{host}/udp/{port}/quic-v1")


class QuicTransport(BaseService):
    """Dial and listen on QUIC v1 multiaddrs; a Host service that adds itself as a transport."""

    def __init__(self, quic_limits: QuicLimits | None = None, handshake_timeout: float | None = None,
                 handshakes: "HandshakeSlots[Any] | None" = None) -> None:
        """``handshake_timeout``: None takes the Host's (``HostConfig.handshake_timeout``).
        ``handshakes``: the pending-handshake slots inbound handshakes take (the Host's resource
        manager, which ``open_stack`` hands in); None accounts for none beyond ``Admission``'s."""
        self.quic_limits = quic_limits or QuicLimits()
        self.handshakes = handshakes
        self.handshake_timeout = handshake_timeout if handshake_timeout is not None else limits.HANDSHAKE_TIMEOUT
        self._own_timeout = handshake_timeout is not None
        self.shared: dict[int, UdpEndpoint] = {}  # address family -> the listening endpoint
        self._certificate: "Certificate | None" = None
        self._identity: "KeyPair | None" = None
        self._loaded: trio.Event | None = None
        self._nursery: trio.Nursery | None = None
        self._admission = Admission()

    # --- service ------------------------------------------------------------------------------
    async def run(self, host: HostAPI, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.host = host
        self._identity = host.keypair
        if not self._own_timeout:
            self.handshake_timeout = host.config.handshake_timeout
        host.add_transport(self)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    def _config(self, is_client: bool):
        from .engine import configuration

        return configuration(self._certificate_now(), is_client=is_client, quic_limits=self.quic_limits)

    def _certificate_now(self) -> "Certificate":
        from ...tls import make_certificate

        if self._identity is None:
            raise trio.ClosedResourceError("the QUIC transport is not running (it is a Host service)")
        if self._certificate is None:
            # one certificate for every connection of this run (the spec allows reuse); made from
            # the wall clock because certificates carry calendar dates
            self._certificate = make_certificate(self._identity, now=time.time())
        return self._certificate

    async def _load(self) -> None:
        """Import aioquic and make our certificate in a worker thread, once."""
        if self._loaded is None:
            self._loaded = trio.Event()

            def load() -> None:
                from . import engine, session  # noqa: F401  (the import is the point)

                self._certificate_now()

            try:
                await trio.to_thread.run_sync(load)
            finally:
                self._loaded.set()
        await self._loaded.wait()

    def _handshake_slot(self, remote: Address):
        """A pending-handshake slot for ``remote`` (shared per source address with TCP's), as a
        release function; None when refused (whoever keeps the slots counts the refusal)."""
        handshakes = self.handshakes
        if handshakes is None:
            return lambda: None
        slot = handshakes.open_handshake(quic_multiaddr(remote), now=trio.current_time())
        if slot is None:
            return None
        return lambda: handshakes.close_handshake(slot)

    def _running_nursery(self) -> trio.Nursery:
        if self._nursery is None:
            raise trio.ClosedResourceError("the QUIC transport is not running (it is a Host service)")
        return self._nursery

    # --- transport ----------------------------------------------------------------------------
    def can_dial(self, addr: Multiaddr) -> bool:
        return is_quic(addr)

    def can_listen(self, addr: Multiaddr) -> bool:
        return is_quic(addr) and addr.protocols()[0] in ("ip4", "ip6")

    def answering(self, host: str) -> bool:
        """Whether a dial of ours from a shared endpoint to ``host`` is in its handshake and has
        heard from it (``UdpEndpoint.answering``)."""
        return any(endpoint.answering(host) for endpoint in self.shared.values())

    def endpoint_for(self, family: int) -> UdpEndpoint | None:
        """The shared (listening) endpoint of ``family``, if we listen on one."""
        return self.shared.get(family)

    async def listen(self, addr: Multiaddr, handler: InboundHandler, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        host, port = quic_endpoint(addr)
        family = socket.AF_INET6 if addr.protocols()[0] == "ip6" else socket.AF_INET
        if family in self.shared:
            raise OSError(errno.EADDRINUSE, "one shared QUIC socket per address family")
        sock = open_udp_socket(host, port, family)
        endpoint = UdpEndpoint(sock, self._config, quic_limits=self.quic_limits, handshake_timeout=self.handshake_timeout,
                               admission=self._admission, shared_slot=self._handshake_slot)

        async def accept(session: "QuicSession") -> None:
            await handler(self._raw(session, endpoint))

        endpoint.accept = accept
        nursery = self._running_nursery()
        await nursery.start(endpoint.serve)
        nursery.start_soon(self._load)
        self.shared[family] = endpoint
        try:
            task_status.started([quic_multiaddr(endpoint.local)])
            await trio.sleep_forever()
        finally:
            del self.shared[family]
            endpoint.close()

    async def dial(
        self,
        addr: Multiaddr,
        *,
        local_port: int | None = None,
        reuse_port_only: bool = False,
        local_host: str | None = None,
        udp_socket: socket.socket | None = None,
    ) -> RawConnection:
        """A connection to ``addr``, secured and multiplexed (see the module docstring).

        ``udp_socket``: dial from this bound socket, which the connection then owns (closed when
        it ends): the socket a birthday probe found a way through a hard NAT with."""
        host, port = quic_endpoint(addr)
        try:
            await self._load()
        except BaseException:
            if udp_socket is not None:
                udp_socket.close()
            raise
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        if not infos:
            raise OSError(errno.EHOSTUNREACH, f"cannot resolve {host}")
        family, _, _, _, sockaddr = infos[0]
        endpoint = self.shared.get(family)
        if local_host is not None or udp_socket is not None or (endpoint is not None and local_port not in (None, endpoint.port)):
            endpoint = None
        if udp_socket is not None:
            udp_socket.setblocking(False)
            endpoint = UdpEndpoint(udp_socket, self._config, quic_limits=self.quic_limits,
                                   handshake_timeout=self.handshake_timeout, closes_when_idle=True)
            await self._running_nursery().start(endpoint.serve)
        elif endpoint is None:
            if reuse_port_only:
                raise OSError(errno.EADDRNOTAVAIL, "no QUIC listen socket to dial from")
            wildcard = "::" if family == socket.AF_INET6 else "0.0.0.0"
            sock = open_udp_socket(local_host or wildcard, local_port or 0, family)
            endpoint = UdpEndpoint(sock, self._config, quic_limits=self.quic_limits,
                                   handshake_timeout=self.handshake_timeout, closes_when_idle=True)
            await self._running_nursery().start(endpoint.serve)
        try:
            # a hole punch's dial (from our listen port, or a probe's socket) outlives ICMP errors
            session = await endpoint.connect(tuple(sockaddr), fail_fast=not reuse_port_only and udp_socket is None)
        finally:
            if endpoint.closes_when_idle and not endpoint.sessions:
                endpoint.close()
        return self._raw(session, endpoint)

    def _raw(self, session: "QuicSession", endpoint: UdpEndpoint) -> RawConnection:
        return RawConnection(None, quic_multiaddr(endpoint.local), quic_multiaddr(session.remote), self, session=session)

    # --- hole punching ------------------------------------------------------------------------
    def punch(self, addr: Multiaddr) -> bool:
        """Send one punch packet to ``addr`` from the shared socket; False when we have none."""
        host, port = quic_endpoint(addr)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        endpoint = self.shared.get(family)
        if endpoint is None:
            return False
        endpoint.punch((host, port))
        return True

    def stats(self) -> list[dict]:
        """Each shared endpoint's connections and dropped datagrams (for status views)."""
        return [endpoint.stats() for endpoint in self.shared.values()]


__all__ = ["QuicTransport", "is_quic", "quic_endpoint", "quic_multiaddr"]
