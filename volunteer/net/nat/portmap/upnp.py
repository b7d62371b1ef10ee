"""UPnP IGD through miniupnpc's Python binding: find the router by SSDP, map and unmap ports.

miniupnpc is a well-kept C client whose calls block (SSDP discovery waits for answers, each
SOAP request is an HTTP round trip); they run in a worker thread, one at a time (a miniupnpc
object is not thread-safe), each bounded by PORTMAP_UPNP_TIMEOUT. A router that calls its
external address reserved (private or documentation ranges: behind another NAT, miniupnpc
says "not connected") is still asked for mappings: whether a mapped address is reachable is for
AutoNAT to find out from outside, never for us to guess from its range.
"""

from __future__ import annotations

import ipaddress
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import trio

from ....errors import PortMappingError
from ... import limits

log = logging.getLogger(__name__)

T = TypeVar("T")
DESCRIPTION = "volunteer"
CONFLICT = "ConflictInMappingEntry"  # miniupnpc's text for UPnP error 718


class UpnpGateway:
    """A router found by SSDP that speaks UPnP IGD (``await UpnpGateway.discover()``)."""

    def __init__(self, client: Any, control_url: str) -> None:
        self._client = client
        self.control_url = control_url
        self.lan_addr: str = client.lanaddr
        self.external_ip: str = ""
        self._lock = trio.Lock()

    @classmethod
    async def discover(cls, delay_ms: int = limits.PORTMAP_UPNP_DISCOVER_MS) -> "UpnpGateway":
        """The first IGD that answers SSDP within ``delay_ms``; PortMappingError if none does."""

        def find() -> tuple[Any, str]:
            import miniupnpc  # a C extension: loaded only when a node maps ports

            client = miniupnpc.UPnP()
            client.discoverdelay = delay_ms
            try:
                found = client.discover()
                if not found:
                    raise PortMappingError("no UPnP device answered")
                return client, client.selectigd()
            except PortMappingError:
                raise
            except Exception as exc:  # miniupnpc raises bare Exception with its error text
                raise PortMappingError(f"UPnP: {exc}") from None

        client, url = await _blocking(find)
        gateway = cls(client, url)
        gateway.external_ip = await gateway._call(client.externalipaddress)
        if gateway.reserved_external_ip:
            log.info("UPnP router %s reports a reserved external address %s (another NAT upstream?); "
                     "mapping anyway, advertised only once dialled back", url, gateway.external_ip)
        return gateway

    @property
    def reserved_external_ip(self) -> bool:
        """Whether the router's external address is in a private, shared or documentation range."""
        try:
            return not ipaddress.ip_address(self.external_ip).is_global
        except ValueError:
            return True

    async def _call(self, fn: Callable[..., T], *args: Any) -> T:
        async with self._lock:
            return await _blocking(lambda: _upnp_call(fn, *args))

    async def map(self, transport: str, internal_port: int, external_port: int, lifetime: int) -> int:
        """Map ``internal_port`` on our LAN address; returns the external port (``external_port``
        when free, another the router picks when it is taken by someone else)."""
        proto = transport.upper()
        try:
            await self._call(self._client.addportmapping, external_port, proto, self.lan_addr, internal_port,
                             DESCRIPTION, "", lifetime)
            return external_port
        except PortMappingError as exc:
            if CONFLICT not in str(exc):
                raise
        # someone else holds that external port: let the router choose (IGDv2's AddAnyPortMapping)
        return int(await self._call(self._client.addanyportmapping, external_port, proto, self.lan_addr,
                                    internal_port, DESCRIPTION, "", lifetime))

    async def unmap(self, transport: str, external_port: int) -> None:
        """Delete our mapping of ``external_port``."""
        await self._call(self._client.deleteportmapping, external_port, transport.upper())


def _upnp_call(fn: Callable[..., T], *args: Any) -> T:
    try:
        return fn(*args)
    except Exception as exc:  # miniupnpc raises bare Exception with its error text
        raise PortMappingError(f"UPnP: {exc}") from None


async def _blocking(fn: Callable[[], T]) -> T:
    """Run a blocking miniupnpc call in a worker thread, given up after PORTMAP_UPNP_TIMEOUT (the
    thread finishes on its own; miniupnpc's sockets have their own timeouts)."""
    with trio.move_on_after(limits.PORTMAP_UPNP_TIMEOUT):
        return await trio.to_thread.run_sync(fn, abandon_on_cancel=True)
    raise PortMappingError("UPnP: the router did not answer in time")


__all__ = ["UpnpGateway"]
