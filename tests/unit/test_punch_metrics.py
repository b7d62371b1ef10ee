"""Hole-punch outcomes as Prometheus metrics: attempts by transport and result, punches by end."""

from __future__ import annotations

from volunteer.cli.metrics import punch_metrics


def test_attempts_by_transport_and_result_and_time_to_direct():
    snapshot = {"attempts": {"quic": {"direct": 3}, "tcp": {"failed": 2, "reversed": 1}}, "direct": 4, "failed": 1,
                "time_to_direct_ms_p50": 180.0}
    families = {family.name: family for family in punch_metrics(snapshot)}
    samples = {(s.labels.get("transport"), s.labels.get("result")): s.value
               for s in families["volunteer_hole_punch_attempts"].samples if s.name.endswith("_total")}
    assert samples == {("quic", "direct"): 3, ("tcp", "failed"): 2, ("tcp", "reversed"): 1}
    ended = {s.labels["result"]: s.value for s in families["volunteer_hole_punches"].samples if s.name.endswith("_total")}
    assert ended == {"direct": 4, "failed": 1}
    assert families["volunteer_hole_punch_time_to_direct_seconds"].samples[0].value == 0.18


def test_no_puncher_no_metrics():
    assert list(punch_metrics(None)) == []
