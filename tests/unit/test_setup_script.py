"""`bash scripts/demo.sh` (the README's first command) installs only what the demo runs; the test
setup (`bash scripts/setup.sh`, which .ci/run uses) installs everything."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fake_checkout(tmp_path: Path) -> Path:
    """A checkout with the real scripts and a venv whose python and pip only log what they are asked."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / ".ci").mkdir()
    for name in ("setup.sh", "demo.sh"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    (repo / ".ci" / "install_peers.sh").write_text(f'echo peers >> "{tmp_path}/calls"\n')
    bin_dir = repo / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("python", "pip"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> "{tmp_path}/calls"\n')
        (bin_dir / tool).chmod(0o755)
    return repo


def test_the_demo_installs_no_test_packages_browser_or_peers(tmp_path):
    repo = fake_checkout(tmp_path)
    # apt-get would be the browser and the NAT rig's packages: it must not be asked
    fake_path = tmp_path / "path"
    fake_path.mkdir()
    (fake_path / "apt-get").write_text(f'#!/bin/sh\necho "apt-get $*" >> "{tmp_path}/calls"\n')
    (fake_path / "apt-get").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake_path}:{os.environ['PATH']}")
    subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), "--demo"], check=True, env=env, capture_output=True,
                   timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    installs = [call for call in calls if call.startswith("pip install -q -e")]
    assert installs == ["pip install -q -e .[examples]"], calls
    assert not any(call.startswith(("apt-get", "peers")) for call in calls), calls


def test_the_test_setup_installs_everything(tmp_path):
    repo = fake_checkout(tmp_path)
    fake_path = tmp_path / "path"
    fake_path.mkdir()
    for cmd in ("ip", "nft", "iptables", "miniupnpd", "tmux", "chromium", "chromedriver"):  # all there: no apt-get
        (fake_path / cmd).write_text("#!/bin/sh\n")
        (fake_path / cmd).chmod(0o755)
    env = dict(os.environ, PATH=f"{fake_path}:{os.environ['PATH']}")
    subprocess.run(["bash", str(repo / "scripts" / "setup.sh")], check=True, env=env, capture_output=True, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    assert "pip install -q -e .[test,examples]" in calls and "peers" in calls, calls
    assert "bash scripts/setup.sh" in (ROOT / ".ci" / "run").read_text()  # CI's setup is the full one
    assert "scripts/setup.sh --demo" in (ROOT / "scripts" / "demo.sh").read_text()
