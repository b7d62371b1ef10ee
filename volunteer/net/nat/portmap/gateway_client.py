"""The trio side of NAT-PMP and PCP: one UDP exchange with the gateway at a time.

Each request is sent from a socket connected to gateway:5351 (so only the gateway's answers come
in) and sent again after 0.25 s, 0.5 s, 1 s... (RFC 6886's schedule, PORTMAP_TRIES sends in
all); datagrams that are not an answer to it are ignored. What the gateway says is decided by the
pure ``natpmp`` and ``pcp`` modules.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from ....errors import PortMappingError, PortMappingMessageError
from ... import limits
from . import natpmp, pcp

log = logging.getLogger(__name__)

T = TypeVar("T")


def retransmit_waits(first: float = limits.PORTMAP_FIRST_RETRANSMIT, tries: int = limits.PORTMAP_TRIES) -> list[float]:
    """How long to wait for an answer after each send: ``first``, doubling, ``tries`` times."""
    return [first * 2**i for i in range(tries)]


async def exchange(sock: trio.socket.SocketType, request: bytes, decode: Callable[[bytes], T],
                   waits: list[float] | None = None) -> T:
    """Send ``request`` on the connected ``sock`` until ``decode`` accepts an answer.

    PortMappingError when nothing answers (or the gateway's port is closed: ICMP unreachable);
    a refusal the gateway states comes out of ``decode`` as a PortMappingError with its code."""
    for wait in waits or retransmit_waits():
        await sock.send(request)
        with trio.move_on_after(wait):
            while True:
                try:
                    data = await sock.recv(limits.PORTMAP_MAX_MESSAGE + 1)
                except ConnectionRefusedError:
                    raise PortMappingError("the gateway does not serve NAT-PMP or PCP (port 5351 closed)") from None
                try:
                    return decode(data)
                except PortMappingMessageError as exc:
                    log.debug("ignored a datagram from the gateway: %s", exc)
    raise PortMappingError("the gateway did not answer on port 5351")


@dataclass
class GatewayClient:
    """NAT-PMP and PCP requests to one gateway (``port``: 5351 but in tests)."""

    gateway: str
    port: int = limits.PORTMAP_SERVER_PORT
    waits: list[float] = field(default_factory=retransmit_waits)
    # one nonce per (transport, internal port): PCP renews and deletes a mapping by its nonce
    _nonces: dict[tuple[str, int], bytes] = field(default_factory=dict)

    async def _socket(self) -> trio.socket.SocketType:
        sock = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            await sock.connect((self.gateway, self.port))
        except BaseException:
            sock.close()
            raise
        return sock

    async def natpmp_external_address(self) -> natpmp.ExternalAddress:
        """The external address as NAT-PMP reports it."""
        with await self._socket() as sock:
            return await exchange(sock, natpmp.external_address_request(), natpmp.decode_external_address, self.waits)

    async def natpmp_map(self, transport: str, internal_port: int, external_port: int, lifetime: int) -> natpmp.Mapped:
        """Map (or, with lifetime 0 and external port 0, unmap) ``internal_port`` by NAT-PMP."""
        request = natpmp.map_request(transport, internal_port, external_port, lifetime)
        with await self._socket() as sock:
            return await exchange(sock, request, lambda data: natpmp.decode_map(data, transport), self.waits)

    async def pcp_map(self, transport: str, internal_port: int, external_port: int, lifetime: int,
                      external_ip: str | None = None) -> pcp.Mapped:
        """Map (or, with lifetime 0, unmap) ``internal_port`` by PCP. A NAT-PMP-only gateway's
        'unsupported version' answer is a PortMappingError with code ``natpmp`` 1."""
        nonce = self._nonces.setdefault((transport, internal_port), os.urandom(pcp.NONCE_SIZE))
        with await self._socket() as sock:
            client_ip = sock.getsockname()[0]
            request = pcp.map_request(nonce, client_ip, transport, internal_port, external_port, lifetime, external_ip)

            def decode(data: bytes) -> pcp.Mapped:
                if natpmp.is_version_refusal(data):
                    raise PortMappingError("the gateway speaks NAT-PMP, not PCP", code=natpmp.RESULT_UNSUPPORTED_VERSION)
                return pcp.decode_map(data, nonce, transport)

            return await exchange(sock, request, decode, self.waits)


__all__ = ["GatewayClient", "exchange", "retransmit_waits"]
