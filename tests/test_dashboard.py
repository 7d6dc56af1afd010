"""The coordinator's dashboard in a real headless browser (Debian's chromium), against a live
local swarm: the round it renders advances without a reload, and every peer is listed."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.request

import pytest

from peer.cli.status import fetch_status
from tests.helpers import wait_line, write_run_config

pytestmark = pytest.mark.integration


def find_chromium() -> str | None:
    return next((path for name in ("chromium", "chromium-browser", "google-chrome") if (path := shutil.which(name))), None)


@pytest.fixture(scope="session")
def chromium() -> str:
    """The browser; installed with apt-get when missing, as CI (root, a fresh Debian-like machine) needs."""
    path = find_chromium()
    if path is None and os.geteuid() == 0 and shutil.which("apt-get"):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
        install = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "chromium"],
                                 capture_output=True, text=True, timeout=1200, env=env)
        path = find_chromium()
        assert path, f"apt-get install chromium failed:\n{install.stdout[-1500:]}\n{install.stderr[-1500:]}"
    assert path, "the dashboard test needs chromium: `sudo apt-get install chromium` (CI installs it itself as root)"
    return path


def render(chromium: str, url: str, tmp_path) -> str:
    """The DOM after the page's scripts ran for a while (virtual time lets its polling timers fire)."""
    result = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=3000", "--dump-dom", url],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def shown_round(dom: str) -> int:
    match = re.search(r'<span id="round">(\d+)</span>', dom)
    assert match, dom[:3000]
    return int(match.group(1))


def test_dashboard_renders_a_live_swarm_in_headless_chromium(swarm, tmp_path, chromium):
    config = write_run_config(tmp_path / "run.json", rounds={"rounds": 200, "expected_peers": 3})
    swarm.start_coordinator(["--config", str(config), "--dashboard-port", "0"])
    peers = [swarm.start_peer(f"p{i}", ["--shard", f"{i}/3"]) for i in range(3)]
    url = wait_line(swarm.children[0], r"coordinator dashboard: (http://\S+)", 90).group(1)
    assert urllib.request.urlopen(url, timeout=10).read().startswith(b"<!doctype html>")

    deadline = time.monotonic() + 120
    while fetch_status(swarm.coordinator_endpoint)["round"] < 1:
        assert time.monotonic() < deadline and all(p.alive() for p in peers)
        time.sleep(0.2)
    first = render(chromium, url, tmp_path)
    first_round = shown_round(first)
    while fetch_status(swarm.coordinator_endpoint)["round"] < first_round + 2:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    second = render(chromium, url, tmp_path)
    assert shown_round(second) >= first_round + 2 >= 3
    status = fetch_status(swarm.coordinator_endpoint)
    rows = re.findall(r'<tr class="(\w+)" data-peer="([0-9a-f]+)">', second)
    assert sorted(peer for _, peer in rows) == sorted(p["peer_id"] for p in status["peers"])
    assert len(rows) == 3 and all(state != "gone" for state, _ in rows)
    assert '<span id="error"></span>' in second  # no failed poll
    assert second.count("<polyline") == 1 and second.count("<rect") >= 2  # the loss curve and a bar per closed round
