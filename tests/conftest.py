"""Shared fixtures: a real swarm on loopback that is always torn down, even when a test fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture
def swarm(tmp_path):
    from peer.cli.launcher import Swarm

    s = Swarm(tmp_path / "swarm")
    try:
        yield s
    finally:
        s.stop_all()
        for child in s.children:  # leave the logs where a failing test can show them
            if child.process.returncode not in (0, None):
                print(f"--- {child.name} (rc={child.process.returncode}) ---\n{''.join(child.lines)[-2000:]}")


def write_run_config(path: Path, **sections) -> Path:
    """A small, fast run config for integration tests."""
    from peer.run.config import RunConfig

    data = RunConfig().to_dict()
    data["model"].update(d_model=64, n_layer=1, n_head=2, seq_len=64)
    data["data"].update(batch_size=4, val_batches=4, max_corpus_bytes=1_000_000)
    data["inner"].update(steps=8, warmup_steps=4)
    data["rounds"].update(rounds=3, min_deadline_s=2.0, deadline_s=30.0, peer_timeout_s=6.0)
    for section, values in sections.items():
        if isinstance(values, dict):
            data[section].update(values)
        else:
            data[section] = values
    path.write_text(json.dumps(RunConfig.from_dict(data).to_dict()))
    return path
