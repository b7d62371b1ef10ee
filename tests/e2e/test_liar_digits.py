"""``examples/train_digits.py --liar times10`` as a user runs it: 3 honest `volunteer join`
processes and one whose ffn experts answer ten times their output (examples/lying_volunteer.py),
each hosting the whole grid, replicas synced every 5 s. The trainer's audits exclude the liar
within 200 of its replies, naming it and why, no honest volunteer is excluded, and training
reaches 95 %; and two liars of three replicas (negated outputs) are excluded on recompute's
proof while the one honest replica trains to 95 % (a vote would have excluded it); and a liar that
joins again under a fresh key each time it is excluded serves under 5 % of the replies. The example
runs in its own process group: whatever happens, every process it started is killed when the test
ends."""

from __future__ import annotations

import json

import pytest

from .conftest import run_example_in_own_group

RUN_LIMIT = 420  # seconds for the whole run (four volunteers start one after another), on a loaded 2-core machine


def run_example(*args: str) -> tuple[int, str]:
    # five processes share two cores: one torch thread each
    return run_example_in_own_group(["train_digits.py", *args], limit=RUN_LIMIT,
                                    env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})


@pytest.mark.slow
def test_a_volunteer_whose_experts_answer_ten_times_their_output_is_excluded_and_training_reaches_95():
    code, out = run_example("--liar", "times10", "--target", "0.95", "--epochs", "15")
    assert code == 0, out[-4000:]
    liar = next(line.split()[1] for line in out.splitlines() if line.startswith("liar: "))
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("summary: ")).removeprefix("summary: "))
    assert summary["liar_excluded"] and summary["liar_excluded_after"] <= 200, summary
    honest = [line for line in out.splitlines() if line.startswith("HONEST volunteer") or "asking a third replica" in line]
    assert summary["honest_excluded"] == 0 and "HONEST volunteer" not in out, "\n".join(honest)
    assert f"excluding volunteer {liar}: its outputs of expert" in out  # the log line names it and why
    assert "reached 95% test accuracy" in out and summary["best"] >= 0.95


@pytest.mark.slow
def test_two_liars_of_three_replicas_are_excluded_by_proof_and_the_honest_one_trains_to_95():
    # two `volunteer join`s of every expert negate their outputs, one is honest: a vote would
    # exclude the honest host; a recompute excludes the two liars and nobody else
    code, out = run_example("--liar", "negate", "--liars", "2", "--honest", "1", "--target", "0.95", "--epochs", "15",
                            "--receipts")
    assert code == 0, out[-4000:]
    liars = [line.split()[1] for line in out.splitlines() if line.startswith("liar: ")]
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("summary: ")).removeprefix("summary: "))
    assert len(liars) == 2 and summary["liars_excluded"] == 2, summary
    assert summary["liar_excluded_after"] <= 200, summary
    assert summary["honest_excluded"] == 0 and "HONEST volunteer" not in out, out[-4000:]
    for liar in liars:
        assert f"excluding volunteer {liar}: its outputs of expert" in out
    assert "contradicted by recompute" in out
    assert "reached 95% test accuracy" in out and summary["best"] >= 0.95


@pytest.mark.slow
@pytest.mark.parametrize("lie, kind", [("scaled", "outputs"), ("turned", "outputs"), ("gradients", "input gradients")])
def test_a_lie_inside_honest_drift_is_excluded_within_500_replies_on_a_real_join(lie, kind):
    # x1.02, 30 degrees at the honest norm, or input gradients x1.02: within replicas' honest
    # drift, so comparison passed them all; a recompute from the state the liar signed does not
    code, out = run_example("--liar", lie, "--honest", "2", "--target", "0.95", "--epochs", "15", "--receipts")
    assert code == 0, out[-4000:]
    liar = next(line.split()[1] for line in out.splitlines() if line.startswith("liar: "))
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("summary: ")).removeprefix("summary: "))
    assert summary["liar_excluded"] and summary["liar_excluded_after"] <= 500, summary
    assert summary["honest_excluded"] == 0 and "HONEST volunteer" not in out, out[-4000:]
    assert f"excluding volunteer {liar}: its {kind} of expert" in out and "contradicted by recompute" in out
    assert "reached 95% test accuracy" in out and summary["best"] >= 0.95


@pytest.mark.slow
def test_a_liar_that_rejoins_under_a_fresh_key_each_time_it_is_caught_serves_under_5_percent_of_replies():
    # a negating `volunteer join` that, excluded, leaves and joins again at once under a new key
    # (told of its exclusion at once: the worst case), over 8 fixed epochs (the target is out of
    # reach on purpose: the run is as long whatever the accuracy, so it exits 1)
    code, out = run_example("--liar", "negate", "--rotate", "--honest", "3", "--receipts", "--epochs", "8",
                            "--target", "1.01")
    assert "summary: " in out, out[-4000:]
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("summary: ")).removeprefix("summary: "))
    assert summary["liar_identities"] >= 2 and summary["liars_excluded"] >= 1, summary  # it did come back
    assert summary["liar_share"] < 0.05, summary
    assert summary["honest_excluded"] == 0 and "HONEST volunteer" not in out, out[-4000:]
    assert "contradicted by recompute" in out and "joins again under a fresh key" in out
    assert summary["best"] >= 0.95, summary
