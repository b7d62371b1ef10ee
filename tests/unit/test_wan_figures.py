"""The WAN benchmark's machinery without the rig: statistics, round trips counted from sends, the
physical limit of a step and what loss adds to it, a step's compute from its volunteers' shares,
the table's last line, the lines a profile crosses, and its options."""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import _wan_compute  # noqa: E402
import _wan_figures as figures  # noqa: E402
import _wan_wire  # noqa: E402
import wan  # noqa: E402
from _wan_figures import Line, StepBytes, loss_recovery_seconds  # noqa: E402


def test_median_and_p95():
    assert figures.median([3, 1, 2]) == 2
    assert figures.median([4, 1, 3, 2]) == 2.5
    values = list(range(1, 51))
    assert figures.percentile(values, 95) == 48  # nearest rank: ceil(0.95 * 50) = 48th
    assert figures.percentile([7], 95) == 7
    with pytest.raises(ValueError):
        figures.median([])
    with pytest.raises(ValueError):
        figures.percentile(values, 0)


def test_round_trips_are_sends_after_half_a_round_trip_of_silence():
    rtt = 0.08
    sends = [
        (0.000, 300),  # a DHT request
        (0.085, 2000), (0.090, 60_000), (0.101, 60_000),  # the forward's calls, one burst
        (0.150, 40),  # a window update while replies arrive: too small to be a request
        (0.400, 60_000), (0.430, 30_000),  # the backward's calls
        (0.600, 500),  # the next step's: outside the window
    ]
    assert figures.count_round_trips(sends, 0.0, 0.5, rtt) == 3
    assert figures.count_round_trips(reversed(sends), 0.0, 0.5, rtt) == 3  # any order
    assert figures.count_round_trips(sends, 0.08, 0.5, rtt) == 2
    assert figures.count_round_trips([], 0.0, 1.0, rtt) == 0
    # slow start after idle: the window's worth, then a wait for acks, then more: each wait counts
    assert figures.count_round_trips([(0.0, 14_000), (0.08, 28_000), (0.16, 56_000)], 0, 1, rtt) == 3


def test_the_limit_is_two_round_trips_the_bytes_over_the_slowest_links_and_the_compute():
    line = figures.Line(trainer_up=10e6, trainer_down=50e6, volunteer_up=10e6, volunteer_down=50e6, rtt=0.08)
    need = figures.StepBytes(to_volunteers=1_000_000, to_trainer=1_000_000)
    # out: the trainer's 10 Mbit/s carries it all (0.8 s); back: each volunteer's 10 Mbit/s carries
    # a quarter (0.2 s), slower than the trainer's 50 Mbit/s carrying all of it (0.16 s)
    assert figures.limit_seconds(line, need, compute=0.5, volunteers=4) == pytest.approx(0.16 + 0.8 + 0.2 + 0.5)
    one = figures.limit_seconds(line, need, compute=0.0, volunteers=1)
    assert one == pytest.approx(0.16 + 0.8 + 0.8)  # a lone volunteer's uplink carries all the replies
    with pytest.raises(ValueError):
        figures.limit_seconds(line, need, 0.0, volunteers=0)


def test_rows_and_the_last_line_read_as_a_script_expects():
    steps = [{"t0": i, "t1": i + 0.5 + 0.1 * (i == 3), "tx0": 1000 * i, "rx0": 2000 * i,
              "tx": 1000 * (i + 1), "rx": 2000 * (i + 1)} for i in range(4)]
    ours = figures.row_from_steps("cable", "ours", steps, 64, limit=0.4, sends=[(0.0, 500)], rtt=0.08)
    assert ours.step_median == pytest.approx(0.5) and ours.step_p95 == pytest.approx(0.6)
    assert ours.samples_per_s == pytest.approx(64 * 4 / 3.6)  # from the first start to the last end
    assert (ours.bytes_up, ours.bytes_down, ours.round_trips) == (1000, 2000, 0.0)
    assert ours.ratio == pytest.approx(1.25)
    theirs = figures.Row("cable", "hivemind", 2.0, 2.5, 32.0, 0, 0, 5, 0.4, 4)
    slow = figures.Row("dsl", "ours", 1.0, 1.0, 10.0, 0, 0, 2, 0.5, 4)
    line = figures.last_line([ours, slow], [theirs])
    assert re.fullmatch(r"wan: limit ratio worst \d+\.\d\d, vs hivemind worst \d+\.\d\d×", line)
    assert line == f"wan: limit ratio worst 2.00, vs hivemind worst {ours.samples_per_s / 32:.2f}×"
    assert figures.last_line([ours], []) == "wan: limit ratio worst 1.25, vs hivemind worst n/a"
    assert "x" in figures.format_row(ours, theirs) and figures.format_row(theirs).split()[:2] == ["cable", "hivemind"]


def test_the_tcp_column_compares_our_step_with_raw_tcp_plus_the_compute():
    ours = figures.Row("cable", "ours", 1.2, 1.5, 50.0, 0, 0, 2, 1.0, 20)
    tcp = figures.Row("cable", "raw tcp", 0.5, 0.6, 128.0, 0, 0, 2, 1.0, 20)
    floor = figures.tcp_floor(tcp, compute=0.3)
    assert floor == pytest.approx(0.8)
    assert figures.format_row(ours, None, floor).endswith(" 1.50x")  # 1.2 s over 0.8 s
    assert figures.format_row(ours).endswith("-")  # no raw TCP row: no figure
    assert "1.50x" not in figures.format_row(tcp, None, floor)  # only our row carries the ratios
    hivemind = figures.Row("cable", "hivemind", 4.0, 5.0, 25.0, 0, 0, 6, 1.0, 20)
    assert figures.format_row(ours, hivemind, floor).endswith(" 2.00x  1.50x")  # vs hm, then vs tcp


def test_profiles_cross_the_lines_they_say():
    cable, base = wan.line_of("cable")
    assert base == "cable" and cable.rtt == pytest.approx(0.08) and cable.trainer_up == 10e6
    relayed, base = wan.line_of("relayed")
    assert base == "cable" and relayed.rtt == pytest.approx(0.12)  # two datacenter legs more
    fibre, _ = wan.line_of("fibre")
    assert (fibre.trainer_down, fibre.volunteer_up, fibre.rtt) == (300e6, 100e6, pytest.approx(0.032))
    assert cable.loss == relayed.loss == fibre.loss == 0.0
    far, _ = wan.line_of("far")
    assert far.loss == pytest.approx(1 - 0.995 ** 2)  # 0.5 % on the trainer's line and on a volunteer's


def test_options():
    quick = wan.parse_args(["--quick"])
    assert (quick.profiles, quick.steps, quick.hivemind_steps) == (list(wan.QUICK_PROFILES), 20, 3)
    full = wan.parse_args([])
    assert full.profiles == list(wan.PROFILES) and full.steps >= 50 and full.hivemind_steps == wan.HIVEMIND_STEPS
    assert wan.parse_args(["--profiles", "dsl, far"]).profiles == ["dsl", "far"]
    assert wan.parse_args(["--steps", "5"]).hivemind_steps == 5
    assert (full.expert_class, full.hidden, full.batch, full.seq, full.label) == ("ffn", wan.HIDDEN, wan.BATCH, 0, "")
    tfm = wan.parse_args(["--expert-class", "transformer"])
    assert (tfm.hidden, tfm.batch, tfm.seq, tfm.label) == (*wan.CLASSES["transformer"], "/tfm")
    assert wan.parse_args(["--expert-class", "transformer", "--hidden", "64"]).hidden == 64
    for bad in (["--profiles", "moon"], ["--steps", "0"], ["--profiles", ","], ["--hidden", "0"], ["--expert-class", "moe"]):
        with pytest.raises(SystemExit):
            wan.parse_args(bad)


def test_a_steps_compute_is_each_phases_slowest_volunteer():
    shares = [[(0.1, 0.3), (0.2, 0.2)], [(0.15, 0.1), (0.1, 0.4)]]  # two volunteers, two rounds
    got = _wan_compute.phases(shares)
    # round 1: forward 0.15, backward 0.3; round 2: forward 0.2, backward 0.4
    assert got["forward"] == pytest.approx(0.175) and got["backward"] == pytest.approx(0.35)
    assert got["step"] == pytest.approx((0.45 + 0.6) / 2)
    for bad in ([], [[]], [[(0.1, 0.1)], [(0.1, 0.1), (0.1, 0.1)]]):
        with pytest.raises(ValueError):
            _wan_compute.phases(bad)


def test_loss_recovery_is_nothing_without_loss_and_about_a_round_trip_per_transfer_with_it():
    need = StepBytes(832_000, 832_000)
    lossless = Line(20e6, 100e6, 20e6, 100e6, rtt=0.3)
    assert loss_recovery_seconds(lossless, need, 4) == 0.0
    far = dataclasses.replace(lossless, loss=0.01)
    extra = loss_recovery_seconds(far, need, 4)
    # 4 transfers a step (two exchanges, each way) of ~70-290 packets at 1 %: most lose one,
    # and a loss costs at most about a round trip beyond the transfer's end
    assert 2 * far.rtt < extra < 4 * far.rtt * 1.1
    assert loss_recovery_seconds(far, need, 4, seed=1) == pytest.approx(extra, rel=0.2)  # a median, not noise
    rarer = loss_recovery_seconds(dataclasses.replace(far, loss=0.001), need, 4)
    assert rarer < extra
    assert loss_recovery_seconds(dataclasses.replace(far, loss=1.0), need, 4) == math.inf
    with pytest.raises(ValueError):
        loss_recovery_seconds(far, need, 0)


def _frame(protocol: int, ip_total: int, tcp_header_words: int = 5) -> bytes:
    ethernet = bytes(12) + (0x0800).to_bytes(2, "big")
    ip = bytes([0x45, 0]) + ip_total.to_bytes(2, "big") + bytes(5) + bytes([protocol]) + bytes(10)
    transport = bytes(12) + bytes([tcp_header_words << 4]) + bytes(7)
    return ethernet + ip + transport


def test_the_wire_counts_quic_datagrams_as_well_as_tcp_segments():
    """Round trips are counted from the trainer's sends whichever transport its calls take: a
    QUIC datagram's payload counts as a TCP segment's does (before, calls over QUIC counted 0)."""
    assert _wan_wire.payload(_frame(6, 20 + 32 + 1400, tcp_header_words=8)) == 1400
    assert _wan_wire.payload(_frame(17, 20 + 8 + 1300)) == 1300
    assert _wan_wire.payload(_frame(1, 84)) is None  # ICMP
    assert _wan_wire.payload(b"\x00" * 20) is None
