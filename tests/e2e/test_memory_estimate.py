"""``volunteer join`` says what the experts will take before it builds any, and refuses in one
line when that is more than the memory allowed (here: the machine's available memory on CPU)."""

from __future__ import annotations

from .conftest import run_cli
from .test_join_cli import one_line_error, unreachable_swarm


def test_join_prints_the_estimate_before_building_the_experts(tmp_path, cli_env):
    swarm = unreachable_swarm(tmp_path)  # the estimate comes before the swarm is reached
    result = run_cli("join", swarm, "--yes", "--experts", "ffn:expert.[0:2]", "--hidden-dim", "64", "--device", "cpu",
                     "--no-dashboard", "--listen", "/ip4/127.0.0.1/tcp/0", env=cli_env)
    assert result.returncode == 1 and "cannot reach swarm" in result.stderr, result.stderr
    line = next(row for row in result.stdout.splitlines() if row.startswith("memory estimate:"))
    assert line.startswith("memory estimate: 2 experts × ") and " on cpu, of " in line and line.endswith(" available"), line


def test_join_refuses_experts_that_would_not_fit_in_one_line(tmp_path, cli_env):
    swarm = unreachable_swarm(tmp_path)
    # 64 ffn experts of width 16384 are about 40 GiB each: far beyond any machine's free memory
    line = one_line_error(run_cli("join", swarm, "--yes", "--experts", "ffn:expert.[0:64]", "--hidden-dim", "16384",
                                  "--device", "cpu", "--no-dashboard", env=cli_env))
    assert "the experts would not fit: 64 experts × " in line, line
    assert "available; host fewer (--max-experts N, or fewer --experts)" in line, line
