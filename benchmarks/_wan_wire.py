"""The trainer's sends, as its line sees them (stdlib only; run in the trainer's namespace, root).

    python _wan_wire.py IFNAME        # prints "ready", records until stdin closes, then one JSON
                                      # line: [[time.monotonic(), payload bytes], ...]

A packet socket with a classic BPF filter that keeps only outgoing frames, cut to their
headers: the trainer's GSO segments arrive whole (one record per write the kernel batched),
so even a 100 Mbit/s uplink is a few hundred records a second. _wan_figures counts round
trips from them.
"""

from __future__ import annotations

import ctypes
import json
import select
import socket
import struct
import sys
import time

ETH_P_IP = 0x0800
SNAP = 128  # bytes kept per frame: Ethernet + IPv4 + TCP headers with options
PACKET_OUTGOING = 4
SO_ATTACH_FILTER = 26
MAX_RECORDS = 2_000_000  # a bound on memory, far above a benchmark run's sends
MAX_SECONDS = 3 * 3600.0

# ld pkttype (ancillary); jeq OUTGOING ? keep SNAP bytes : drop
_FILTER = [
    (0x20, 0, 0, 0xFFFFF004),  # BPF_LD|BPF_W|BPF_ABS, SKF_AD_OFF + SKF_AD_PKTTYPE
    (0x15, 0, 1, PACKET_OUTGOING),  # BPF_JMP|BPF_JEQ|BPF_K
    (0x06, 0, 0, SNAP),  # BPF_RET|BPF_K
    (0x06, 0, 0, 0),
]


UDP_HEADER = 8


def payload(frame: bytes) -> int | None:
    """TCP or UDP (QUIC) payload bytes of an Ethernet/IPv4 frame (from the IP length, so a GSO
    frame counts whole), or None for anything else."""
    if len(frame) < 14 + 20 or struct.unpack_from("!H", frame, 12)[0] != ETH_P_IP:
        return None
    ihl = (frame[14] & 0x0F) * 4
    total = struct.unpack_from("!H", frame, 16)[0]
    protocol = frame[14 + 9]
    if protocol == socket.IPPROTO_UDP:
        return max(0, total - ihl - UDP_HEADER)
    if protocol != socket.IPPROTO_TCP or len(frame) < 14 + ihl + 13:
        return None
    doff = (frame[14 + ihl + 12] >> 4) * 4
    return max(0, total - ihl - doff)


def main(ifname: str) -> int:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    program = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *ins) for ins in _FILTER))
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                    struct.pack("HL", len(_FILTER), ctypes.addressof(program)))  # struct sock_fprog
    sock.bind((ifname, 0x0003))
    sock.setblocking(False)
    print("ready", flush=True)
    records: list[tuple[float, int]] = []
    end = time.monotonic() + MAX_SECONDS
    stdin = sys.stdin.fileno()
    while time.monotonic() < end:
        ready, _, _ = select.select([sock, stdin], [], [], 1.0)
        if stdin in ready and not sys.stdin.buffer.read1(4096):
            break
        if sock not in ready:
            continue
        while len(records) < MAX_RECORDS:
            try:
                frame = sock.recv(SNAP)
            except BlockingIOError:
                break
            now = time.monotonic()
            size = payload(frame)
            if size:
                records.append((round(now, 6), size))
    print(json.dumps(records), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
