"""After an applied round a peer serves θ_{r+1}'s parts to joiners and wakes its heartbeat
(peer/node/state_serving.py): overlapped rounds do both on the state writer, beside the next inner
phase, in that order; a failure to serve is logged and the heartbeat still wakes."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from peer.node.state_serving import announce_state


def fake_node() -> SimpleNamespace:
    return SimpleNamespace(round=4, heartbeat=SimpleNamespace(now=threading.Event()),
                           writer=ThreadPoolExecutor(max_workers=1, thread_name_prefix="swarmloco-state"))


@pytest.mark.parametrize("overlapped", [True, False])
def test_the_state_is_served_then_the_heartbeat_woken_on_the_writer_when_overlapped(overlapped):
    seen = []
    node = fake_node()
    announce_state(lambda: seen.append((threading.current_thread().name, node.heartbeat.now.is_set())),
                   heartbeat=node.heartbeat, round_=node.round, writer=node.writer if overlapped else None)
    node.writer.shutdown(wait=True)
    assert len(seen) == 1 and seen[0][1] is False  # served before the heartbeat was woken
    assert seen[0][0].startswith("swarmloco-state") is overlapped  # synchronous rounds: on the calling thread
    assert node.heartbeat.now.is_set()


def test_a_peer_out_of_sync_serves_nothing_and_still_wakes_its_heartbeat():
    node = fake_node()
    announce_state(None, heartbeat=node.heartbeat, round_=node.round, writer=node.writer)
    node.writer.shutdown(wait=True)
    assert node.heartbeat.now.is_set()


def test_a_failure_to_serve_is_logged_and_the_heartbeat_still_wakes(caplog):
    def publish():
        raise OSError("store full")

    node = fake_node()
    with caplog.at_level(logging.WARNING, logger="swarmloco.peer"):
        announce_state(publish, heartbeat=node.heartbeat, round_=node.round, writer=node.writer)
        node.writer.shutdown(wait=True)
    assert node.heartbeat.now.is_set()
    assert "could not serve the state of round 4 to joiners: store full" in caplog.text
