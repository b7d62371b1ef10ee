"""AutoNAT v1 (`/libp2p/autonat/1.0.0`): are we reachable from the outside? Ask peers to dial back.

The client sends DIAL with its addresses; the server dials them back on a fresh connection and
answers OK or E_DIAL_ERROR. Reachability is decided from such evidence only: several agreeing
answers from distinct servers, never a guess from IP ranges. Servers follow the spec's safety
rules: dial only the requester's observed IP, never for a request that came through a relay,
never relayed addresses, at most a few addresses, rate-limited per peer and in total.
"""

from __future__ import annotations

import enum
import logging
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass

import trio

from ...errors import RemoteProtocolError, VolunteerError, describe
from .. import limits
from ..identity import PeerID
from ..multiaddr import Multiaddr
from ..pb.autonat_pb2 import Message  # generated: mypy sees it as Any (pyproject's override)
from ..pb.decode import parse
from ..ratelimit import RateLimiter
from ..service import BaseService, Handler, HostAPI
from ..streams import BufferedStream, close_quietly
from ..varint import encode_uvarint

log = logging.getLogger(__name__)

AUTONAT = "/libp2p/autonat/1.0.0"
MAX_DIAL_ADDRS = limits.AUTONAT_MAX_DIAL_ADDRS
OK, E_DIAL_ERROR, E_DIAL_REFUSED, E_BAD_REQUEST = (
    Message.OK, Message.E_DIAL_ERROR, Message.E_DIAL_REFUSED, Message.E_BAD_REQUEST,
)


class Reachability(enum.Enum):
    """AutoNAT's verdict on whether others can dial us."""

    UNKNOWN = "unknown"
    PUBLIC = "public"
    PRIVATE = "private"


# --- core: deciding from evidence -------------------------------------------------------


class ReachabilityTracker:
    """Keeps the latest answer from each server; decides when ``required`` distinct servers agree.

    A decision flips only when the contrary evidence reaches ``required`` too, so one odd answer
    does not make a node flap between public and private.
    """

    def __init__(self, required: int = limits.AUTONAT_REQUIRED_CONFIRMATIONS, memory: int = limits.AUTONAT_MEMORY) -> None:
        self.required = required
        self._answers: OrderedDict[PeerID, bool] = OrderedDict()
        self._memory = memory
        self.status = Reachability.UNKNOWN
        self.confirmed_addr: Multiaddr | None = None

    def record(self, server: PeerID, reachable: bool, addr: Multiaddr | None = None) -> Reachability:
        """Note ``server``'s latest answer; returns the (possibly new) verdict."""
        self._answers.pop(server, None)
        self._answers[server] = reachable
        while len(self._answers) > self._memory:
            self._answers.popitem(last=False)
        if reachable and addr is not None:
            self.confirmed_addr = addr
        yes = sum(self._answers.values())
        no = len(self._answers) - yes
        if yes >= self.required and yes > no:
            self.status = Reachability.PUBLIC
        elif no >= self.required and no > yes:
            self.status = Reachability.PRIVATE
            self.confirmed_addr = None
        return self.status

    @property
    def evidence(self) -> tuple[int, int]:
        """(servers that reached us, servers that did not), among the remembered answers."""
        yes = sum(self._answers.values())
        return yes, len(self._answers) - yes


def _ip(addr: Multiaddr) -> str | None:
    return addr.value_for("ip4") or addr.value_for("ip6")


def dialable_addrs(requested: list[Multiaddr], observed_ip: str | None) -> list[Multiaddr]:
    """The spec's safety filter: direct TCP and QUIC v1 addresses on the requester's own observed IP.

    A requester we see without an IP (over a relay, or the memory transport) gets nothing
    dialled: otherwise its /dns addresses, which have no IP either, would pass as "its own".
    """
    if observed_ip is None:
        return []
    out: list[Multiaddr] = []
    for addr in requested:
        names = addr.without_peer_id().protocols()
        direct = names[1:] in (["tcp"], ["udp", "quic-v1"])
        if addr.is_relayed() or not direct or _ip(addr) != observed_ip:
            continue
        if addr.without_peer_id() not in out:
            out.append(addr.without_peer_id())
    return out[:MAX_DIAL_ADDRS]


def per_peer_limiter(requests: int = limits.AUTONAT_RATE_PER_PEER, window: float = limits.AUTONAT_RATE_WINDOW) -> RateLimiter:
    """At most ``requests`` dial-back requests per peer in a burst, refilled over ``window`` seconds."""
    return RateLimiter(rate=requests / window, burst=requests)


def total_limiter(requests: int = limits.AUTONAT_RATE_TOTAL, window: float = limits.AUTONAT_RATE_WINDOW) -> RateLimiter:
    """At most ``requests`` dial-back requests from everyone together, refilled over ``window``."""
    return RateLimiter(rate=requests / window, burst=requests, max_keys=1)


_EVERYONE: Hashable = "everyone"  # the one key of the server's total limit


# --- wire --------------------------------------------------------------------------------


async def _read(stream: BufferedStream) -> Message:
    body = await stream.receive_length_prefixed(limits.AUTONAT_MAX_MESSAGE, "autonat message")
    return parse(Message, body, "autonat message")


async def _write(stream, message: Message) -> None:
    body = message.SerializeToString()
    await stream.send_all(encode_uvarint(len(body)) + body)


def _response(status: int, text: str = "", addr: Multiaddr | None = None) -> Message:
    message = Message(type=Message.DIAL_RESPONSE)
    message.dialResponse.status = status
    if text:
        message.dialResponse.statusText = text[:200]
    if addr is not None:
        message.dialResponse.addr = addr.to_bytes()
    return message


# --- server ------------------------------------------------------------------------------


class AutoNATServer(BaseService):
    """Answers dial-back requests for others on a Host (a service), rate-limited per peer and in total."""

    def __init__(self, per_peer: RateLimiter | None = None, total: RateLimiter | None = None) -> None:
        # ``is None``, not ``or``: an empty RateLimiter has no keys yet, so it is falsy.
        self.per_peer = per_peer_limiter() if per_peer is None else per_peer
        self.total = total_limiter() if total is None else total
        self.served = 0
        self.refused = 0

    def handlers(self) -> dict[str, Handler]:
        return {AUTONAT: self.handle}

    def _allow(self, peer: PeerID, now: float) -> bool:
        # Both buckets must have a token before either is spent: a refused peer costs others nothing.
        if self.per_peer.tokens(peer, now=now) < 1 or self.total.tokens(_EVERYONE, now=now) < 1:
            return False
        return self.per_peer.allow(peer, now=now) and self.total.allow(_EVERYONE, now=now)

    async def handle(self, stream) -> None:
        """Serve one DIAL request."""
        buffered = BufferedStream(stream)
        conn = stream.connection
        try:
            request = await _read(buffered)
        except RemoteProtocolError as exc:
            await _write(stream, _response(E_BAD_REQUEST, str(exc)))
            return
        if request.type != Message.DIAL or not request.HasField("dial"):
            await _write(stream, _response(E_BAD_REQUEST, "expected DIAL"))
            return
        if conn.remote_addr.is_relayed():
            self.refused += 1
            await _write(stream, _response(E_DIAL_REFUSED, "will not dial back over a relayed connection"))
            return
        peer = stream.remote_peer
        if request.dial.peer.HasField("id") and request.dial.peer.id and request.dial.peer.id != peer.to_bytes():
            await _write(stream, _response(E_BAD_REQUEST, "peer id does not match the connection"))
            return
        if not self._allow(peer, trio.current_time()):
            self.refused += 1
            await _write(stream, _response(E_DIAL_REFUSED, "rate limited"))
            return
        requested = []
        for raw in request.dial.peer.addrs[: 4 * MAX_DIAL_ADDRS]:
            try:
                requested.append(Multiaddr.from_bytes(raw))
            except VolunteerError:
                continue
        addrs = dialable_addrs(requested, _ip(conn.remote_addr))
        if not addrs:
            self.refused += 1
            await _write(stream, _response(E_DIAL_REFUSED, f"no dialable address on your observed IP {_ip(conn.remote_addr)}"))
            return
        self.served += 1
        reached = await self._dial_back(peer, addrs)
        if reached is not None:
            await _write(stream, _response(OK, addr=reached))
        else:
            await _write(stream, _response(E_DIAL_ERROR, "dial back failed"))

    async def _dial_back(self, peer: PeerID, addrs: list[Multiaddr]) -> Multiaddr | None:
        for addr in addrs:
            try:
                with trio.fail_after(limits.AUTONAT_DIAL_BACK_TIMEOUT):
                    # A fresh connection from an ephemeral port: proves the address takes unsolicited dials.
                    conn = await self.host.dial_addr(addr, peer, local_port=0)
            except (VolunteerError, OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
                log.debug("autonat dial back to %s failed: %s", addr, describe(exc))
                continue
            await conn.aclose()
            return addr
        return None


# --- client ------------------------------------------------------------------------------


@dataclass
class ProbeResult:
    """One server's answer to a probe."""

    server: PeerID
    reachable: bool | None  # None: the server refused or failed, no evidence either way
    addr: Multiaddr | None = None
    text: str = ""


async def probe(host: HostAPI, server: PeerID | Multiaddr | str, addrs: list[Multiaddr]) -> ProbeResult:
    """Ask ``server`` to dial us back on ``addrs``."""
    with trio.fail_after(limits.AUTONAT_REQUEST_TIMEOUT):
        conn = await host.connect(server)
        stream = BufferedStream(await conn.new_stream([AUTONAT]))
        request = Message(type=Message.DIAL)
        request.dial.peer.id = host.peer_id.to_bytes()
        request.dial.peer.addrs.extend(a.to_bytes() for a in addrs[: 4 * MAX_DIAL_ADDRS])
        try:
            await _write(stream, request)
            reply = await _read(stream)
        finally:
            await close_quietly(stream)
    status = reply.dialResponse.status
    text = reply.dialResponse.statusText
    if status == OK:
        addr = Multiaddr.from_bytes(reply.dialResponse.addr) if reply.dialResponse.addr else None
        return ProbeResult(conn.remote_peer, True, addr, text)
    if status == E_DIAL_ERROR:
        return ProbeResult(conn.remote_peer, False, None, text)
    return ProbeResult(conn.remote_peer, None, None, text or Message.ResponseStatus.Name(status))
