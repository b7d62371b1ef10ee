"""TCP on trio, with port reuse: outgoing connections leave from the listen port.

Hole punching needs it (both peers dial each other from the port the NAT mapped, a TCP
simultaneous open), and it makes identify's observed address meaningful: an endpoint-independent
NAT shows every peer the same external port, the one others can dial.
"""

from __future__ import annotations

import errno
import logging
import socket
import sys

import trio

from ...errors import MultiaddrError
from .. import limits
from ..multiaddr import Multiaddr
from .base import InboundHandler, RawConnection
from .tcpstream import stream_of

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 256


def tcp_endpoint(addr: Multiaddr) -> tuple[str, int]:
    """(host, port) of /ip4|ip6|dns|dns4|dns6/…/tcp/N; MultiaddrError for anything else."""
    components = addr.components
    if len(components) < 2 or components[0][0] not in ("ip4", "ip6", "dns", "dns4", "dns6") or components[1][0] != "tcp":
        raise MultiaddrError(f"{addr} is not a TCP address")
    host, port = components[0][1], components[1][1]
    assert host is not None and port is not None  # the parser gives every ip/dns/tcp component a value
    return host, int(port)


def _is_plain_tcp(addr: Multiaddr) -> bool:
    names = addr.protocols()
    return len(names) >= 2 and names[0] in ("ip4", "ip6", "dns", "dns4", "dns6") and names[1] == "tcp" and (
        len(names) == 2 or (len(names) == 3 and names[2] == "p2p")
    )


def sockaddr_to_multiaddr(sockaddr) -> Multiaddr:
    host, port = sockaddr[0], sockaddr[1]
    family = "ip6" if ":" in host else "ip4"
    if family == "ip6" and host.startswith("::ffff:") and "." in host:
        family, host = "ip4", host[7:]
    return Multiaddr(f"/{family}/{host}/tcp/{port}")


# Linux: a flow with under 4 packets in flight that times out retransmits at linear intervals (up
# to 6 times) instead of doubling each time. Expert calls and DHT requests are such flows: a reply
# whose last packets are lost has nothing behind it to trigger a fast retransmit, and on a lossy
# 300 ms path two back-to-back timeouts with doubling held a training step for 5 to 10 s.
TCP_THIN_LINEAR_TIMEOUTS = getattr(socket, "TCP_THIN_LINEAR_TIMEOUTS", 16)


def _tune_for_calls(sock) -> None:
    """Socket options for request/reply traffic: no Nagle delay on small writes, linear
    retransmission timeouts for thin flows (best effort: not every system has them)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if sys.platform.startswith("linux"):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, TCP_THIN_LINEAR_TIMEOUTS, 1)
        except OSError:
            pass


def _enable_reuse(sock: trio.socket.SocketType) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if hasattr(socket, "SO_REUSEPORT"):  # not on Windows
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)


def _check_port_free(family: int, host: str, port: int) -> None:
    """Raise EADDRINUSE when another socket listens on (host, port).

    A listener bound with SO_REUSEPORT shares its port with every socket of the same user that
    sets the option too, and Linux then balances incoming connections among them: a second
    daemon on the same port would take half the first one's dials. A probe bound without
    SO_REUSEPORT fails on any port someone listens on, and costs nothing for a free one (it is
    closed before the listener binds)."""
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a restart's TIME_WAIT is no holder
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        probe.bind((host, port))
    finally:
        probe.close()


NO_LISTEN_PORT = "no listen port to dial from"  # reuse_port_only without a TCP listener (not a taken 4-tuple)


class TcpTransport:
    """Dial and listen on TCP multiaddrs."""

    def __init__(self, reuse_port: bool = True) -> None:
        self.reuse_port = reuse_port and hasattr(socket, "SO_REUSEPORT")
        # (family, bound ip, port) of every listener: dials reuse the port of the same family.
        self.listen_endpoints: list[tuple[int, str, int]] = []
        self.refused_redials = 0  # refused punches dialled again (see dial's redial_refused_for)

    @property
    def listen_ports(self) -> list[int]:
        return [port for _, _, port in self.listen_endpoints]

    def can_dial(self, addr: Multiaddr) -> bool:
        return _is_plain_tcp(addr)

    def can_listen(self, addr: Multiaddr) -> bool:
        return _is_plain_tcp(addr) and addr.protocols()[0] in ("ip4", "ip6")

    async def dial(
        self,
        addr: Multiaddr,
        *,
        local_port: int | None = None,
        reuse_port_only: bool = False,
        local_host: str | None = None,
        redial_refused_for: float = 0.0,
    ) -> RawConnection:
        """Connect; from ``local_port`` (default: our listen port) when port reuse is on.

        ``reuse_port_only``: fail rather than fall back to an ephemeral port (hole punching).
        ``local_host``: the source address to leave from (a loopback alias in tests, one NIC of
        several), with ``local_port`` or an ephemeral port.
        ``redial_refused_for``: seconds during which a refused connection (ECONNREFUSED) is dialled
        again TCP_REFUSED_REDIAL_DELAY later. A punched SYN can reach the peer's router before the
        peer's own SYN has left, and a router that answers unsolicited SYNs with a RST refuses it;
        the same SYN a moment later meets the mapping the peer's SYN opened.
        """
        deadline = trio.current_time() + redial_refused_for
        while True:
            try:
                return await self._dial_once(addr, local_port=local_port, reuse_port_only=reuse_port_only, local_host=local_host)
            except ConnectionRefusedError:
                if trio.current_time() + limits.TCP_REFUSED_REDIAL_DELAY >= deadline:
                    raise
                self.refused_redials += 1
                await trio.sleep(limits.TCP_REFUSED_REDIAL_DELAY)

    async def _dial_once(
        self, addr: Multiaddr, *, local_port: int | None, reuse_port_only: bool, local_host: str | None
    ) -> RawConnection:
        host, port = tcp_endpoint(addr)
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        if not infos:
            raise OSError(errno.EHOSTUNREACH, f"cannot resolve {host}")
        family, _, _, _, sockaddr = infos[0]
        sock: trio.socket.SocketType | None
        if local_host is not None:
            sock = await self._connect(family, sockaddr, (local_host, local_port or 0))
            return self._connected(sock)
        bind = self._bind_endpoint(family, local_port)
        sock = None
        if bind is not None:
            try:
                sock = await self._connect(family, sockaddr, bind)
            except OSError as exc:
                if reuse_port_only:
                    raise
                # The 4-tuple may be taken (we already talk to that peer from this port): use an ephemeral port.
                log.debug("dial %s from port %s failed (%s); retrying from an ephemeral port", addr, bind[1], exc)
        elif reuse_port_only:
            raise OSError(errno.EADDRNOTAVAIL, NO_LISTEN_PORT)
        if sock is None:
            sock = await self._connect(family, sockaddr, None)
        return self._connected(sock)

    def _connected(self, sock: trio.socket.SocketType) -> RawConnection:
        try:
            local, remote = sockaddr_to_multiaddr(sock.getsockname()), sockaddr_to_multiaddr(sock.getpeername())
        except BaseException:
            sock.close()  # reset right after it connected (ENOTCONN): nothing owns it yet
            raise
        return RawConnection(stream_of(sock), local, remote, self)

    def _bind_endpoint(self, family: int, local_port: int | None) -> tuple[str, int] | None:
        if not self.reuse_port or local_port == 0:  # 0: an ephemeral port on purpose (AutoNAT dial-back)
            return None
        for listen_family, ip, port in self.listen_endpoints:
            if listen_family == family:
                return ip, local_port or port
        if local_port:
            return ("::" if family == socket.AF_INET6 else "0.0.0.0"), local_port
        return None

    @staticmethod
    async def _connect(family: int, sockaddr, bind: tuple[str, int] | None) -> trio.socket.SocketType:
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            _tune_for_calls(sock)
            if bind is not None:
                _enable_reuse(sock)
                await sock.bind(bind)
            await sock.connect(sockaddr)
        except BaseException:
            sock.close()
            raise
        return sock

    async def listen(self, addr: Multiaddr, handler: InboundHandler, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        host, port = tcp_endpoint(addr)
        family = socket.AF_INET6 if addr.protocols()[0] == "ip6" else socket.AF_INET
        if self.reuse_port and port != 0:
            _check_port_free(family, host, port)  # a port another process listens on is refused
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
        try:
            _enable_reuse(sock) if self.reuse_port else sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            await sock.bind((host, port))
            sock.listen(LISTEN_BACKLOG)
        except BaseException:
            sock.close()
            raise
        bound_ip, bound_port = sock.getsockname()[:2]
        endpoint = (family, bound_ip, bound_port)
        self.listen_endpoints.append(endpoint)
        listener = trio.SocketListener(sock)
        local = sockaddr_to_multiaddr((bound_ip, bound_port))

        async def serve_one(accepted: trio.SocketStream) -> None:
            try:
                _tune_for_calls(accepted.socket)
                remote = sockaddr_to_multiaddr(accepted.socket.getpeername())
            except OSError:
                await trio.aclose_forcefully(accepted)
                return
            await handler(RawConnection(stream_of(accepted.socket), local, remote, self))

        try:
            async with listener:
                async with trio.open_nursery() as nursery:
                    task_status.started([local])
                    await trio.serve_listeners(serve_one, [listener], handler_nursery=nursery)
        finally:
            self.listen_endpoints.remove(endpoint)
