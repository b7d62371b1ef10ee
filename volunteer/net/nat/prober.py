"""Birthday probing, the trio side: the hard side's many sockets, the easy side's paced probes.

What to do is ``birthday.BirthdayStep``'s (pure); this module only opens, sends, waits and hands
over. The hard side's sockets are plain non-blocking UDP sockets, each sending one packet to the
easy side's external address (that opens a mapping on the hard NAT) and then listening; the first
one that hears from that address is the way through, and is handed to the QUIC transport, which
dials from it and closes it with that connection. Every other socket is closed when the probe
ends, won or not. The easy side sends from its shared QUIC socket (the one its NAT maps to the
address the hard side sends to) and waits for the hard side's QUIC dial to arrive there.
"""

from __future__ import annotations

import logging
import os
import socket

import trio

from .. import limits
from ..transport.quic import QuicTransport
from .birthday import BirthdayStep

log = logging.getLogger(__name__)


def _punch_payload() -> bytes:
    # a short header with the fixed bit clear: a QUIC endpoint drops it as not QUIC, never as a
    # packet that opens a connection
    payload = bytearray(os.urandom(limits.QUIC_HOLE_PUNCH_PACKET))
    payload[0] &= 0x3F
    return bytes(payload)


async def open_hard_sockets(step: BirthdayStep) -> socket.socket | None:
    """The hard side: open ``step.sockets`` sockets (paced), send from each to the easy side's
    address, and return the first that receives a datagram from it (the caller owns it and dials
    from it); None when none does before the caller's deadline cancels us. The others are closed."""
    target = (step.target_ip, step.target_port)
    opened: list[socket.socket] = []
    winner: list[socket.socket] = []
    try:
        async with trio.open_nursery() as nursery:

            async def listen(sock: socket.socket) -> None:
                while True:
                    await trio.lowlevel.wait_readable(sock)
                    try:
                        _, source = sock.recvfrom(2048)
                    except (BlockingIOError, InterruptedError):
                        continue
                    except OSError:  # an ICMP error for this socket's destination: it is no way through
                        return
                    if (source[0], source[1]) == target and not winner:
                        winner.append(sock)
                        nursery.cancel_scope.cancel()
                        return

            started = trio.current_time()
            for offset in step.send_times():
                await trio.sleep_until(started + offset)
                try:
                    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                except OSError as exc:  # out of file descriptors: probe with what we have
                    log.info("birthday probe: opened %d of %d sockets (%s)", len(opened), step.sockets, exc)
                    break
                opened.append(sock)
                sock.setblocking(False)
                sock.bind(("0.0.0.0", 0))
                try:
                    sock.sendto(_punch_payload(), target)
                except OSError as exc:
                    log.debug("birthday probe: send from socket %d failed: %s", len(opened), exc)
                nursery.start_soon(listen, sock)
            await trio.sleep_forever()
    finally:
        for sock in opened:
            if not winner or sock is not winner[0]:
                sock.close()
    return winner[0] if winner else None


async def spray_probes(quic: QuicTransport, step: BirthdayStep) -> int:
    """The easy side: one probe to each of ``step.ports`` at the hard side's IP from our shared
    IPv4 QUIC socket, ``step.burst`` at a time every ``step.interval``; returns how many went out
    (none without a shared socket)."""
    endpoint = quic.endpoint_for(socket.AF_INET)
    if endpoint is None:
        return 0
    await trio.sleep(limits.BIRTHDAY_EASY_DELAY)
    started = trio.current_time()
    sent = 0
    for offset, port in zip(step.send_times(), step.ports):
        if offset > trio.current_time() - started:
            await trio.sleep_until(started + offset)
        endpoint.punch((step.target_ip, port))
        sent += 1
    return sent


__all__ = ["open_hard_sockets", "spray_probes"]
