"""LAN discovery with multicast DNS, as libp2p's mDNS spec has it: two volunteers on one LAN find
each other with no configuration.

Each node registers a service of type ``_p2p._udp.local.`` under a random 32-character instance
name, with one TXT string ``dnsaddr=<multiaddr>/p2p/<peer-id>`` per address, and browses for
the others. zeroconf does the DNS and runs its own threads; this module bridges it to trio:
browse events cross over a memory channel, the blocking lookups and (un)registration run in
worker threads, so the event loop never blocks.
"""

from __future__ import annotations

import logging
import secrets
import socket
import string
from typing import TYPE_CHECKING, Callable, Sequence

import trio

if TYPE_CHECKING:  # zeroconf is imported when mDNS runs: a node without it never loads it
    from zeroconf import ServiceBrowser, ServiceInfo, Zeroconf

log = logging.getLogger(__name__)

SERVICE = "_p2p._udp.local."
PREFIX = b"dnsaddr="
MAX_TXT = 255  # one TXT string's length byte
REFRESH = 5.0  # seconds between checks of our own addresses
LOOKUP_MS = 3000
MAX_LOOKUPS = 4  # concurrent TXT lookups: a LAN full of libp2p nodes must not take every worker thread


def encode_txt(entries: Sequence[str]) -> bytes:
    """Raw TXT record data: length-prefixed ``dnsaddr=…`` strings (each at most 255 bytes)."""
    out = bytearray()
    for entry in entries:
        data = PREFIX + entry.encode()
        if len(data) <= MAX_TXT:
            out += bytes([len(data)]) + data
    return bytes(out)


def parse_txt(data: bytes | None) -> list[str]:
    """The ``dnsaddr`` multiaddrs in raw TXT data; malformed strings are skipped, never raised."""
    out: list[str] = []
    if not data:
        return out
    pos = 0
    while pos < len(data):
        length = data[pos]
        entry = data[pos + 1 : pos + 1 + length]
        pos += 1 + length
        if len(entry) != length or not entry.startswith(PREFIX):
            continue
        try:
            text = entry[len(PREFIX) :].decode()
        except UnicodeDecodeError:
            continue
        if text.startswith("/"):
            out.append(text)
    return out


def _instance_name() -> str:
    alphabet = string.ascii_letters + string.digits
    return "".join(secrets.choice(alphabet) for _ in range(32))


class MdnsDiscovery:
    """Announce ``get_addrs()`` on the LAN and call ``on_peer(peer_id, addrs)`` for others found.

    ``get_addrs`` returns full multiaddrs (ending in ``/p2p/<peer_id>``); ``interfaces`` goes to
    zeroconf (e.g. ``["127.0.0.1"]`` in tests; default: every interface).
    """

    def __init__(
        self,
        peer_id: str,
        get_addrs: Callable[[], list[str]],
        on_peer: Callable[[str, list[str]], None],
        *,
        interfaces: Sequence[str] | None = None,
    ) -> None:
        self.peer_id = str(peer_id)
        self.get_addrs = get_addrs
        self.on_peer = on_peer
        self.interfaces = list(interfaces) if interfaces else None
        self.name = f"{_instance_name()}.{SERVICE}"
        self.found: dict[str, list[str]] = {}
        # instance name → how many times it said goodbye: a lookup that began before a goodbye
        # answers from what the peer announced before it left, so it reports nothing
        self._departures: dict[str, int] = {}
        self._names: dict[str, set[str]] = {}  # instance name -> the peers its TXT record named
        self._resolving: dict[str, bool] = {}  # name -> whether it changed again since the lookup began
        self._limiter = trio.CapacityLimiter(MAX_LOOKUPS)
        self._info: ServiceInfo | None = None
        self._browser: ServiceBrowser | None = None

    def _service_info(self, addrs: list[str]) -> ServiceInfo:
        from zeroconf import ServiceInfo

        ips = []
        for addr in addrs:
            parts = addr.split("/")
            if len(parts) > 2 and parts[1] == "ip4":
                try:
                    ips.append(socket.inet_aton(parts[2]))
                except OSError:
                    continue
        port = next((int(p) for a in addrs for i, p in enumerate(a.split("/")) if i and a.split("/")[i - 1] == "tcp"), 0)
        return ServiceInfo(SERVICE, self.name, addresses=ips or [socket.inet_aton("127.0.0.1")], port=port or 1,
                           properties=encode_txt(addrs), server=f"{self.name.split('.')[0]}.local.")

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Announce and browse until cancelled; unregisters and closes zeroconf on the way out."""
        from zeroconf import InterfaceChoice, IPVersion, ServiceBrowser, ServiceListener, Zeroconf

        interfaces = self.interfaces or InterfaceChoice.All
        zc = await trio.to_thread.run_sync(lambda: Zeroconf(interfaces=interfaces, ip_version=IPVersion.V4Only))
        send, receive = trio.open_memory_channel(256)
        token = trio.lowlevel.current_trio_token()

        def deliver(event: tuple[bool, str]) -> None:  # trio's thread
            try:
                send.send_nowait(event)
            except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
                pass  # a flood of announcements: later refreshes bring them back

        def seen(name: str, added: bool = True) -> None:  # zeroconf's browser thread
            # never block this thread on trio: ServiceBrowser.cancel() joins it, and a
            # from_thread.run_sync waiting here for a busy trio thread would deadlock
            try:
                token.run_sync_soon(deliver, (added, name))
            except trio.RunFinishedError:
                pass

        class Handler(ServiceListener):
            def add_service(self, zc: Zeroconf, type_: str, name: str) -> None:
                seen(name)

            def update_service(self, zc: Zeroconf, type_: str, name: str) -> None:
                seen(name)

            def remove_service(self, zc: Zeroconf, type_: str, name: str) -> None:
                seen(name, added=False)

        try:
            announced = sorted(self.get_addrs())
            self._info = info = self._service_info(announced)
            await trio.to_thread.run_sync(zc.register_service, info)
            self._browser = ServiceBrowser(zc, SERVICE, Handler())
            task_status.started()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._refresh, zc, announced)
                async for added, name in receive:
                    if name == self.name:
                        continue
                    if not added:
                        self._forget(name)
                    elif name in self._resolving:
                        self._resolving[name] = True  # look again once the lookup under way ends
                    else:
                        self._resolving[name] = False
                        nursery.start_soon(self._resolve, zc, name)
        finally:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._close, zc)

    def _close(self, zeroconf: Zeroconf) -> None:
        # in a worker thread: cancel() joins zeroconf's browser thread, unregister_service waits
        # for the goodbye packets
        if self._browser is not None:
            self._browser.cancel()
        try:
            if self._info is not None:
                zeroconf.unregister_service(self._info)
        except Exception:  # shutting down: an unregister that fails only leaves a stale record
            pass
        zeroconf.close()

    def _forget(self, name: str) -> None:
        # a peer that leaves and comes back with the same addresses is reported again
        self._departures[name] = self._departures.get(name, 0) + 1
        for peer in self._names.pop(name, ()):
            self.found.pop(peer, None)

    async def _refresh(self, zeroconf: Zeroconf, announced: list[str]) -> None:
        while True:
            await trio.sleep(REFRESH)
            current = sorted(self.get_addrs())
            if current != announced:
                announced = current
                self._info = info = self._service_info(current)
                await trio.to_thread.run_sync(zeroconf.update_service, info)

    async def _resolve(self, zeroconf: Zeroconf, name: str) -> None:
        # one lookup per instance name at a time; announcements during it bring one more
        try:
            again = True
            while again:
                self._resolving[name] = False
                departures = self._departures.get(name, 0)
                info = await trio.to_thread.run_sync(
                    zeroconf.get_service_info, SERVICE, name, LOOKUP_MS, limiter=self._limiter
                )
                if info is not None and self._departures.get(name, 0) == departures:
                    self._report(name, info)
                again = self._resolving[name]
        finally:
            del self._resolving[name]

    def _report(self, name: str, info) -> None:
        addrs = parse_txt(info.text)
        peers = {a.rsplit("/p2p/", 1)[1] for a in addrs if "/p2p/" in a}
        peers.discard(self.peer_id)
        self._names[name] = peers
        for peer in peers:
            mine = [a for a in addrs if a.endswith(f"/p2p/{peer}")]
            if self.found.get(peer) != mine:
                self.found[peer] = mine
                try:
                    self.on_peer(peer, mine)
                except Exception:  # a callback bug must not stop discovery
                    log.exception("mDNS peer callback failed")


__all__ = ["MdnsDiscovery", "SERVICE", "encode_txt", "parse_txt"]
