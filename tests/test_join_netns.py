"""scripts/join_netns.py's pure half: the README lines it runs are still there with the placeholders it
fills in (a README edit that breaks the trial fails here, without root or namespaces), and
docs/join-trial.md's trial section is exactly what its JSON renders to."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import join_netns  # noqa: E402


def test_the_readme_lines_the_trial_runs_are_there_with_their_placeholders():
    commands = join_netns.readme_commands((ROOT / "README.md").read_text())
    assert commands["install"] == "python3 -m venv .venv && .venv/bin/pip install ."
    join = commands["join"]
    assert join.startswith(".venv/bin/swarmloco peer ") and "--resume" in join and "--identity-path" in join
    assert join_netns.MADDR_EXAMPLE.search(join) and join_netns.PEER_EXAMPLE_IP in join
    filled = join_netns.MADDR_EXAMPLE.sub("/ip4/10.77.0.1/tcp/31337/p2p/12D3KooWabc", join).replace(join_netns.PEER_EXAMPLE_IP, "10.77.0.2")
    assert "203.0.113" not in filled and "--announce-host 10.77.0.2" in filled
    coordinator = commands["coordinator"]
    assert "swarmloco coordinator" in coordinator and f"--announce-host {join_netns.COORD_EXAMPLE_IP}" in coordinator
    assert "--port 31338" in coordinator and "/tcp/31337" in coordinator  # the ports the trial dials


def test_the_doc_section_is_rendered_from_its_json():
    run = json.loads((ROOT / "docs/join-trial.json").read_text())
    doc = (ROOT / "docs/join-trial.md").read_text()
    assert doc.endswith("\n\n" + join_netns.render(run, "docs/join-trial.json"))
    assert join_netns.verdicts(run["trial"]) == run["verdicts"]
    assert all(run["verdicts"].values())
