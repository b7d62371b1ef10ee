"""A userspace L2 "wire" that adds delay, jitter and loss between two interfaces.

The kernel here has no netem, so the NAT rig puts this program between two veth ends in a
"wire" namespace: every frame that arrives on one end is sent out of the other after a fixed
delay (plus optional uniform jitter), unless it is lost (``--loss-pct``) or the queue for that
direction is full (then it is dropped, like a router's tail drop).

Frames are read and written with ``PACKET_VNET_HDR``: the kernel hands us the offload metadata
(GSO size, "checksum not computed yet") with each frame and we hand it back on send, so TCP
segmentation and checksum offload keep working across the wire without ethtool.

Run by the rig as a subprocess (``python delayer.py --a IF --b IF --delay-ms 20``); it prints
``ready`` once both sockets are bound, exits when its parent dies, on SIGTERM, or after
``--max-seconds``. Order is kept per direction (jitter never reorders frames) because real
access links rarely reorder and TCP tests should not depend on it.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import select
import signal
import socket
import sys
import time

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23  # Linux 4.20+: the socket does not see the frames we send
VNET_LEN = 10  # sizeof(struct virtio_net_hdr) in front of every frame
PACKET_OUTGOING = 4  # pkttype of frames we (or the kernel) sent out of that interface
RECV_SIZE = 256 * 1024  # a GSO frame is at most 64 KiB, a BIG TCP one more; be generous
MAX_BATCH = 256  # frames read per socket per wake-up, so one busy side cannot starve the other
PARENT_POLL_S = 0.5  # how often we check that the rig that started us is still alive


class Direction:
    """One direction of the wire: a bounded FIFO of (due time, frame)."""

    def __init__(self, out: socket.socket, max_frames: int, max_bytes: int) -> None:
        self.out = out
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.bytes = 0
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.last_due = 0.0
        self.sent = self.lost = self.dropped = 0

    def push(self, due: float, frame: bytes) -> None:
        """Queue a frame, or count it as dropped when the queue is full."""
        if len(self.queue) >= self.max_frames or self.bytes + len(frame) > self.max_bytes:
            self.dropped += 1
            return
        due = max(due, self.last_due)  # keep order under jitter
        self.last_due = due
        self.queue.append((due, frame))
        self.bytes += len(frame)

    def flush(self, now: float) -> None:
        """Send every frame whose time has come."""
        while self.queue and self.queue[0][0] <= now:
            _, frame = self.queue.popleft()
            self.bytes -= len(frame)
            try:
                self.out.send(frame)
                self.sent += 1
            except OSError:  # interface went down (teardown) or a frame the kernel refused
                self.dropped += 1

    def next_due(self) -> float | None:
        """When the head of the queue is due, or None when empty."""
        return self.queue[0][0] if self.queue else None


def open_socket(ifname: str) -> socket.socket:
    """A raw packet socket on one interface, with virtio-net headers on every frame."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    try:
        # without it every frame we forward comes back to us once, doubling the reads
        sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    except OSError:
        pass  # older kernel: the PACKET_OUTGOING check in the loop skips them instead
    sock.bind((ifname, ETH_P_ALL))
    sock.setblocking(False)
    return sock


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options; delays in milliseconds, loss in percent."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--a", required=True, help="first interface")
    p.add_argument("--b", required=True, help="second interface")
    p.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay, each direction")
    p.add_argument("--jitter-ms", type=float, default=0.0, help="uniform +- jitter")
    p.add_argument("--loss-pct", type=float, default=0.0, help="random loss, each direction")
    p.add_argument("--queue", type=int, default=1000, help="max frames queued per direction")
    p.add_argument("--queue-bytes", type=int, default=8 << 20, help="max bytes per direction")
    p.add_argument("--max-seconds", type=float, default=6 * 3600.0, help="lifetime bound")
    p.add_argument("--seed", type=int, default=None, help="seed for loss and jitter")
    p.add_argument("--verbose", action="store_true", help="log every frame to stderr")
    args = p.parse_args(argv)
    if not (0 <= args.delay_ms <= 10_000 and 0 <= args.jitter_ms <= 10_000):
        p.error("delay and jitter must be within 0..10000 ms")
    if not 0 <= args.loss_pct <= 100:
        p.error("loss must be within 0..100 %")
    return args


def main(argv: list[str] | None = None) -> int:
    """Forward frames between two interfaces until told to stop; returns the exit status."""
    args = parse_args(argv)
    rng = random.Random(args.seed)
    stop = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    parent = os.getppid()
    sa, sb = open_socket(args.a), open_socket(args.b)
    dirs = {
        sa.fileno(): Direction(sb, args.queue, args.queue_bytes),
        sb.fileno(): Direction(sa, args.queue, args.queue_bytes),
    }
    socks = {sa.fileno(): sa, sb.fileno(): sb}
    delay, jitter = args.delay_ms / 1000.0, args.jitter_ms / 1000.0
    loss = args.loss_pct / 100.0
    print("ready", flush=True)
    start = last_check = time.monotonic()
    end = start + args.max_seconds
    buf = bytearray(RECV_SIZE)
    view = memoryview(buf)
    wakes = 0
    while not stop:
        now = time.monotonic()
        if now >= end:
            break
        if now - last_check >= PARENT_POLL_S:
            last_check = now
            if os.getppid() != parent:
                break
        dues = [d for d in (x.next_due() for x in dirs.values()) if d is not None]
        wait = min([PARENT_POLL_S, end - now] + [max(0.0, d - now) for d in dues])
        try:
            ready, _, _ = select.select(list(socks), [], [], wait)
        except InterruptedError:
            continue
        wakes += 1
        now = time.monotonic()
        for fd in ready:
            sock, d = socks[fd], dirs[fd]
            for _ in range(MAX_BATCH):
                try:
                    n, addr = sock.recvfrom_into(buf)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    break
                if addr[2] == PACKET_OUTGOING:  # our own sends, seen on the way out
                    continue
                if args.verbose:
                    print(f"{now - start:.4f} {addr[0]} type={addr[2]} len={n} "
                          f"{bytes(buf[VNET_LEN:VNET_LEN + 14]).hex()} "
                          f"{bytes(buf[VNET_LEN + 14:VNET_LEN + 42]).hex()}", file=sys.stderr)
                if loss and rng.random() < loss:
                    d.lost += 1
                    continue
                extra = rng.uniform(-jitter, jitter) if jitter else 0.0
                d.push(now + max(0.0, delay + extra), bytes(view[:n]))  # one copy
        now = time.monotonic()
        for d in dirs.values():
            d.flush(now)
    for name, d in zip((args.a + "->" + args.b, args.b + "->" + args.a), dirs.values()):
        print(f"{name}: sent={d.sent} lost={d.lost} dropped={d.dropped}", file=sys.stderr)
    times = os.times()  # what the wire cost the machine it shares with the homes
    print(f"wake-ups={wakes} cpu: user {times.user:.2f} s, system {times.system:.2f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
