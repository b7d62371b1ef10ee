"""The relay's public swarm health page in a real browser (Debian's chromium, headless, through
chromium-driver and selenium), from processes started as an organiser and donors would: a relay
with ``--web`` watching a swarm file's grid, and three ``volunteer join`` daemons (two under a
public name). The coverage map must show the live experts, the contributors the donors a trainer
vouched for (its Swarm publishes its vouches as it leaves), the
entry points up and down; a screenshot is taken (and copied to /tmp/health-shots/)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request

import pytest

from volunteer.net.identity import KeyPair
from volunteer.net.multiaddr import Multiaddr
from volunteer.swarmfile import GridSpec, SwarmSpec, load_swarm_file

from .test_donor_browser import CHROMIUM, DRIVER, browser, wait_until
from .test_donor_cli import Joined, call_experts
from .test_metrics_and_paths import stop

SHOTS = "/tmp/health-shots"
GRID = GridSpec("expert", (3, 4), "ffn", 8, replicas=2)
HOSTED = {  # who hosts what: a mix of covered (2 replicas), under-replicated (1) and missing (0)
    "Ada's lab": ["expert.0.0", "expert.0.1", "expert.0.2", "expert.0.3", "expert.1.0"],
    "Grace": ["expert.0.0", "expert.0.1", "expert.1.1", "expert.1.2"],
    None: ["expert.1.0", "expert.2.0"],
}
REPLICAS = {uid: sum(uid in uids for uids in HOSTED.values()) for uid in GRID.uids()}

if not (CHROMIUM and DRIVER) and os.environ.get("VOLUNTEER_REQUIRE_BROWSER") != "1":
    pytest.skip("chromium and chromium-driver are not installed (scripts/setup.sh installs them as root)",
                allow_module_level=True)


class Relay:
    """``volunteer relay --web 127.0.0.1:0 --swarm FILE``: its address and its page's URL."""

    def __init__(self, swarm_file, identity, env: dict) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "volunteer", "relay", "--listen", "/ip4/127.0.0.1/tcp/0", "--no-dashboard",
             "--swarm", str(swarm_file), "--web", "127.0.0.1:0", "--identity", str(identity)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        self.lines: list[str] = []
        self.addr = self.url = ""
        deadline = time.monotonic() + 60
        while not (self.addr and self.url) and time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if line.startswith("listening on /ip4/127.0.0.1/"):
                self.addr = line.split()[2]
            if line.startswith("health page on "):
                self.url = line.split()[3]
        if not (self.addr and self.url):
            self.stop()
            raise AssertionError("the relay did not start:\n" + "".join(self.lines))

    def health(self) -> dict:
        with urllib.request.urlopen(self.url + "api/health", timeout=10) as reply:
            return json.loads(reply.read())

    def stop(self) -> None:
        stop(self.proc)


def replicas_shown(model: dict) -> dict[str, int]:
    return {c["uid"]: c["replicas"] for c in model["swarms"][0]["grids"][0]["cells"]}


@pytest.mark.slow
def test_the_health_page_shows_the_live_swarm_in_a_browser(tmp_path, cli_env):
    env = {**os.environ, **cli_env, "PYTHONUNBUFFERED": "1"}
    gone = KeyPair.generate().peer_id  # a bootstrap peer that is down: nothing listens there
    swarm_file = tmp_path / "health.toml"
    spec = SwarmSpec("health", "health", [Multiaddr(f"/ip4/127.0.0.1/tcp/9/p2p/{gone}")], [], grids=[GRID])
    swarm_file.write_text(spec.to_toml())
    relay = Relay(swarm_file, tmp_path / "relay.key", env)
    donors: list[Joined] = []
    driver = None
    try:
        # the donors' swarm file also names the relay (the organiser publishes it once the relay runs)
        spec.relays = [Multiaddr(relay.addr)]
        swarm_file.write_text(spec.to_toml())
        assert load_swarm_file(swarm_file).grids == [GRID]
        for i, (name, uids) in enumerate(HOSTED.items()):
            named = ["--name", name] if name else []
            donors.append(Joined(str(swarm_file), "--yes", "--no-mdns", "--device", "cpu", "--hidden-dim", "8",
                                 "--experts", f"ffn:{','.join(uids)}", "--identity", str(tmp_path / f"v{i}.key"),
                                 "--checkpoints", str(tmp_path / f"ckpt{i}"), *named, env=env,
                                 control=tmp_path / "run" / f"v{i}.sock"))
        assert call_experts(str(swarm_file), ["expert.0.2", "expert.1.1"], times=3) == []
        model = wait_until(lambda: (m := relay.health()) and replicas_shown(m) == REPLICAS
                           and len(m["swarms"][0]["contributors"]["rows"]) == 2
                           and sum(c["calls"] for c in m["swarms"][0]["contributors"]["rows"]) == 12 and m,
                           "the relay's model never showed the swarm", timeout=90)
        swarm = model["swarms"][0]
        assert swarm["volunteers"]["up"] == 3
        assert {p["role"]: p["up"] for p in swarm["entry_points"]} == {"relay": True, "bootstrap": False}

        profile = tmp_path / "chromium"
        driver = browser(profile)
        driver.get(relay.url)
        cells = driver.execute_script(
            "return Array.from(document.querySelectorAll('#map-expert g.cell')).map("
            "g => [g.getAttribute('class'), g.querySelector('title').textContent]);")
        assert len(cells) == GRID.count
        by_uid = {title.split(":")[0]: css for css, title in cells}
        for uid, count in REPLICAS.items():
            want = "missing" if count == 0 else "under" if count < GRID.replicas else "covered"
            assert by_uid[uid] == f"cell {want}", (uid, by_uid[uid])
        # the trainer vouched for 3 forwards and 3 backwards on each named donor's expert; the
        # unnamed donor served nothing, so it is not listed (self-reported counters rank nobody)
        assert sorted((c["name"], c["calls"]) for c in swarm["contributors"]["rows"]) == [("Ada's lab", 6), ("Grace", 6)]
        contributors = driver.execute_script(
            "return Array.from(document.querySelectorAll('#contributors tbody tr')).map(r => r.cells[1].textContent);")
        assert sorted(c.split(" …")[0] for c in contributors) == ["Ada's lab", "Grace"]
        assert driver.execute_script("return document.querySelectorAll('#volunteers tbody tr').length;") == 3
        assert "down" in driver.execute_script("return document.getElementById('entry-points').textContent;")
        # the page is drawn at its natural height, then kept for a person to look at
        height = driver.execute_script("return document.body.scrollHeight;")
        driver.set_window_size(1400, max(900, height + 40))
        path = tmp_path / "health.png"
        driver.save_screenshot(str(path))
        os.makedirs(SHOTS, exist_ok=True)
        shutil.copy(path, os.path.join(SHOTS, "health.png"))
    finally:
        if driver is not None:
            driver.quit()
        for donor in donors:
            donor.stop()
        relay.stop()
