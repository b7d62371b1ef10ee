"""--max-ram caps what the experts take on the CPU, as --max-gpu-memory does on a GPU: placement
hosts what fits, named experts that do not fit are refused in one line before any is built."""

from __future__ import annotations


import pytest
import torch

from volunteer.cli import consent
from volunteer.cli.joincmd import build_options
from volunteer.cli.main import build_parser
from volunteer.cli.memory import bytes_per_expert, estimate_for
from volunteer.kinds.options import VolunteerOptions
from volunteer.replicas.providers import placement_capacity
from volunteer.swarmfile import GridSpec

GRID = GridSpec("expert", (4, 4), "ffn", 64)
CPU = torch.device("cpu")


def test_placement_on_the_cpu_hosts_what_fits_in_the_ram_cap():
    per_expert = bytes_per_expert("ffn", 64)
    assert placement_capacity([GRID], CPU, max_ram=3 * per_expert + 1) == 3
    assert placement_capacity([GRID], CPU, max_ram=per_expert - 1) == 0  # not even one: none placed
    assert placement_capacity([GRID], CPU) == 8  # no cap: the default, as before
    assert placement_capacity([GRID], CPU, max_ram=1 << 40) == 8  # a cap above it takes no more than the default
    assert placement_capacity([GRID], CPU, max_ram=per_expert, max_experts=5) == 5  # --max-experts decides


def test_named_experts_past_the_ram_cap_are_refused_before_any_is_built():
    per_expert = bytes_per_expert("ffn", 64)
    node = VolunteerOptions(expert_class="ffn", uids=[f"expert.0.{i}" for i in range(4)], hidden_dim=64, device="cpu",
                            max_ram=2 * per_expert)
    estimate = estimate_for(node, [GRID])
    assert estimate is not None and not estimate.fits
    assert "allowed by --max-ram" in estimate.refusal()
    node.max_ram = 4 * per_expert
    assert estimate_for(node, [GRID]).fits


def test_join_takes_max_ram_as_a_size_and_shows_it_before_consent(tmp_path, monkeypatch):
    monkeypatch.setenv("VOLUNTEER_CONFIG_DIR", str(tmp_path / "cfg"))
    monkeypatch.setenv("VOLUNTEER_STATE_DIR", str(tmp_path / "state"))
    swarm = tmp_path / "s.toml"
    swarm.write_text('name = "s"\nid = "s"\n')
    args = build_parser("join").parse_args(["join", str(swarm), "--max-ram", "2GiB", "--identity", str(tmp_path / "k")])
    options = build_options(args)
    assert options.node.max_ram == 2 << 30
    lines = consent.summary_lines(options.node, policy_lines=["always"], web=None)
    assert "RAM:           at most 2.0 GiB for the experts on the CPU (--max-ram)" in lines
    with pytest.raises(SystemExit):  # not a size: a usage error, as every [join] setting's flag
        build_parser("join").parse_args(["join", str(swarm), "--max-ram", "lots"])
