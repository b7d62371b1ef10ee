"""The WAN benchmark's arithmetic, pure (no rig, no torch): step statistics, round trips counted
from the trainer's sends, the physical limit of a step on a line, the table and its last line.

Round trips are counted on the wire, the same way for every trainer: a send of the trainer
(a TCP segment or UDP datagram carrying at least ``MIN_REQUEST_PAYLOAD`` bytes) that follows at least half a
round trip of silence began a new exchange the step had to wait for. Calls sent together count
once; a DHT lookup counts each of its sequential waves; a transfer held back by TCP's window
(slow start after idle) counts each round it waited.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Iterable, Sequence

MIN_REQUEST_PAYLOAD = 100  # bytes: smaller sends are acks, yamux window updates, pings, repair reports
PACKET_PAYLOAD = 1448  # bytes of a full TCP segment on a 1500-byte path (what a loss takes out)


def median(values: Sequence[float]) -> float:
    """The median (the mean of the middle two for an even count)."""
    if not values:
        raise ValueError("median of nothing")
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile by the nearest-rank method (p95 of 50 values: the 48th)."""
    if not values:
        raise ValueError("percentile of nothing")
    if not 0 < pct <= 100:
        raise ValueError("pct must be within (0, 100]")
    s = sorted(values)
    return s[max(0, math.ceil(pct / 100 * len(s)) - 1)]


def count_round_trips(sends: Iterable[tuple[float, int]], start: float, end: float, rtt: float,
                      min_payload: int = MIN_REQUEST_PAYLOAD) -> int:
    """Exchanges begun in [start, end): sends of at least ``min_payload`` bytes, each after at
    least ``rtt / 2`` without one (the first of the window always counts). ``sends``: (time,
    payload bytes) of the trainer's outgoing segments, any order."""
    gap = rtt / 2
    count, last = 0, None
    for t, size in sorted(s for s in sends if s[1] >= min_payload and start <= s[0] < end):
        if last is None or t - last >= gap:
            count += 1
        last = t
    return count


@dataclasses.dataclass(frozen=True)
class Line:
    """Rates of the lines a step crosses, in bits/s, and the round trip trainer <-> volunteer."""

    trainer_up: float
    trainer_down: float
    volunteer_up: float
    volunteer_down: float
    rtt: float  # seconds
    loss: float = 0.0  # probability that a packet between trainer and volunteer is lost, each way


@dataclasses.dataclass(frozen=True)
class StepBytes:
    """Payload a step's tensors need, in bytes: trainer -> volunteers and back."""

    to_volunteers: float
    to_trainer: float


def limit_seconds(line: Line, step: StepBytes, compute: float, volunteers: int) -> float:
    """The physical limit of one step: two round trips (forward, backward), each direction's
    bytes over the slowest link they cross (the trainer's line carries all of them, each
    volunteer's its share), and the experts' compute."""
    if volunteers < 1:
        raise ValueError("at least one volunteer")
    out = max(step.to_volunteers * 8 / line.trainer_up, step.to_volunteers / volunteers * 8 / line.volunteer_down)
    back = max(step.to_trainer * 8 / line.trainer_down, step.to_trainer / volunteers * 8 / line.volunteer_up)
    return 2 * line.rtt + out + back + compute


def _transfer_recovery(packets: int, rate: float, rtt: float, loss: float, rng: random.Random) -> float:
    """Seconds a transfer of ``packets`` sent back to back at ``rate`` packets/s outlasts its
    lossless time when each packet (and each resend) is lost with probability ``loss`` and a
    lost one is resent one round trip after it left."""
    end = packets / rate
    finish, index = end, -1
    while True:
        index += 1 + int(math.log(1.0 - rng.random()) / math.log1p(-loss))  # the next lost packet
        if index >= packets:
            return finish - end
        tries = 1
        while rng.random() < loss:
            tries += 1
        finish = max(finish, (index + 1) / rate + tries * rtt)


def loss_recovery_seconds(line: Line, step: StepBytes, volunteers: int, rounds: int = 2000, seed: int = 0) -> float:
    """The median time per step that even an ideal reliable transport spends on ``line.loss``:
    one that sends at the line's rate from the first byte and resends a lost packet exactly one
    round trip after it left (no transport learns of a loss sooner without redundancy). A step
    is two exchanges; in each, the trainer's requests share its uplink and each volunteer's
    reply its own, and the exchange waits for its last packet. 0 on a lossless line."""
    if volunteers < 1:
        raise ValueError("at least one volunteer")
    if line.loss <= 0.0:
        return 0.0
    if line.loss >= 1.0:
        return math.inf
    out_rate = min(line.trainer_up, volunteers * line.volunteer_down) / 8 / PACKET_PAYLOAD
    back_rate = min(line.volunteer_up, line.trainer_down / volunteers) / 8 / PACKET_PAYLOAD
    requests = math.ceil(step.to_volunteers / 2 / PACKET_PAYLOAD)
    replies = math.ceil(step.to_trainer / 2 / volunteers / PACKET_PAYLOAD)
    rng = random.Random(seed)
    samples = []
    for _ in range(rounds):
        extra = 0.0
        for _exchange in range(2):
            extra += _transfer_recovery(requests, out_rate, line.rtt, line.loss, rng)
            extra += max(_transfer_recovery(replies, back_rate, line.rtt, line.loss, rng) for _ in range(volunteers))
        samples.append(extra)
    return median(samples)


@dataclasses.dataclass
class Row:
    """One profile's figures for one trainer (ours or hivemind's)."""

    profile: str
    system: str
    step_median: float
    step_p95: float
    samples_per_s: float
    bytes_up: float  # per step, on the trainer's line
    bytes_down: float
    round_trips: float  # median per step
    limit: float
    steps: int

    @property
    def ratio(self) -> float:
        """Median step time over the physical limit."""
        return self.step_median / self.limit


def row_from_steps(profile: str, system: str, steps: Sequence[dict], batch: int, limit: float,
                   sends: Sequence[tuple[float, int]], rtt: float) -> Row:
    """Figures from a trainer's measured steps (each: ``t0``, ``t1`` monotonic seconds, ``tx``,
    ``rx`` bytes of its line so far) and its sends on the wire."""
    if not steps:
        raise ValueError(f"{system} on {profile}: no steps measured")
    times = [s["t1"] - s["t0"] for s in steps]
    trips = [count_round_trips(sends, s["t0"], s["t1"], rtt) for s in steps]
    span = steps[-1]["t1"] - steps[0]["t0"]
    return Row(
        profile=profile, system=system, step_median=median(times), step_p95=percentile(times, 95),
        samples_per_s=batch * len(steps) / span if span > 0 else 0.0,
        bytes_up=(steps[-1]["tx"] - steps[0]["tx0"]) / len(steps),
        bytes_down=(steps[-1]["rx"] - steps[0]["rx0"]) / len(steps),
        round_trips=median(trips), limit=limit, steps=len(steps),
    )


HEADER = (f"{'profile':11} {'trainer':9} {'median':>8} {'p95':>8} {'samples/s':>9} {'up/step':>9} "
          f"{'down/step':>9} {'RTs':>5} {'limit':>7} {'ratio':>6} {'vs hm':>6} {'vs tcp':>6}")


def tcp_floor(tcp: Row, compute: float) -> float:
    """A step's measured floor: raw TCP moving the step's payload in its two exchanges over the
    same lines (``tcp``'s median), plus the experts' compute."""
    return tcp.step_median + compute


def format_row(row: Row, hivemind: Row | None = None, floor: float | None = None) -> str:
    """One table line; ``vs hm``: our samples/s over hivemind's on the same profile; ``vs tcp``:
    our median step over ``floor`` (``tcp_floor``)."""
    versus = f"{row.samples_per_s / hivemind.samples_per_s:5.2f}x" if hivemind and hivemind.samples_per_s else "     -"
    over_tcp = f"{row.step_median / floor:5.2f}x" if floor else "     -"
    if row.system != "ours":
        versus = over_tcp = "      "
    return (f"{row.profile:11} {row.system:9} {row.step_median:7.3f}s {row.step_p95:7.3f}s {row.samples_per_s:9.1f} "
            f"{row.bytes_up / 1e6:7.2f}MB {row.bytes_down / 1e6:7.2f}MB {row.round_trips:5.1f} "
            f"{row.limit:6.3f}s {row.ratio:5.2f}x {versus} {over_tcp}").rstrip()


def last_line(ours: Sequence[Row], hivemind: Sequence[Row]) -> str:
    """``wan: limit ratio worst X.XX, vs hivemind worst Y.YY×``: the worst profile's median step
    over its limit, and the worst profile's samples/s over hivemind's (n/a without hivemind)."""
    if not ours:
        raise ValueError("no profile measured")
    worst_limit = max(r.ratio for r in ours)
    theirs = {r.profile: r for r in hivemind if r.samples_per_s > 0}
    versus = [r.samples_per_s / theirs[r.profile].samples_per_s for r in ours if r.profile in theirs]
    shown = f"{min(versus):.2f}×" if versus else "n/a"
    return f"wan: limit ratio worst {worst_limit:.2f}, vs hivemind worst {shown}"
