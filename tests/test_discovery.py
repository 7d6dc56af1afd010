"""hivemind DHT discovery with Ed25519-signed records, on loopback with real DHT nodes."""

import pytest
from hivemind.utils import get_dht_time

from protocol import discovery
from protocol.identity import Identity

LOOPBACK = ["/ip4/127.0.0.1/tcp/0"]


@pytest.fixture
def two_nodes():
    coordinator, peer = Identity.generate(), Identity.generate()
    first = discovery.start_dht(coordinator, host_maddrs=LOOPBACK)
    second = None
    try:
        second = discovery.start_dht(peer, initial_peers=discovery.visible_maddrs(first), host_maddrs=LOOPBACK)
        yield coordinator, peer, first, second
    finally:
        if second is not None:
            second.shutdown()
        first.shutdown()


def test_run_and_peer_records_are_found_and_signed(two_nodes):
    coordinator, peer, first, second = two_nodes
    assert discovery.announce_run(first, coordinator, run_id="r1", endpoint="127.0.0.1:5000")
    record = discovery.find_run(second, timeout_s=10)
    assert (record.run_id, record.endpoint, record.coordinator_id) == ("r1", "127.0.0.1:5000", coordinator.peer_id)
    assert record.public_key == coordinator.public_key
    assert get_dht_time() < record.expires_at <= get_dht_time() + discovery.RECORD_TTL_S  # when it lapses (a standby's call deadlines)

    assert discovery.announce_peer(second, peer, run_id="r1", endpoint="127.0.0.1:5001", client_mode=False, version="t")
    peers = discovery.list_peers(first, "r1")
    assert list(peers) == [peer.peer_id] and peers[peer.peer_id]["endpoint"] == "127.0.0.1:5001"


def test_record_in_another_peers_name_is_refused(two_nodes):
    coordinator, peer, first, second = two_nodes
    discovery.announce_peer(first, coordinator, run_id="r1", endpoint="127.0.0.1:5000", client_mode=False, version="t")
    # The peer tries to overwrite the coordinator's record (subkey = the coordinator's peer_id).
    stored = second.store(discovery.peers_key("r1"), b'{"endpoint": "evil"}', get_dht_time() + 30, subkey=coordinator.peer_id)
    assert not stored
    assert discovery.list_peers(first, "r1")[coordinator.peer_id]["endpoint"] == "127.0.0.1:5000"


def test_unsigned_record_is_invalid():
    validator = discovery.Ed25519RecordValidator(b"\x01" * 32)
    from hivemind.dht.validation import DHTRecord
    from hivemind.utils import MSGPackSerializer

    record = DHTRecord(b"k" * 20, MSGPackSerializer.dumps("someone"), MSGPackSerializer.dumps(b"v"), 1e12)
    assert not validator.validate(record)
    signed = DHTRecord(record.key, MSGPackSerializer.dumps(validator._me().peer_id), record.value, record.expiration_time)
    good = DHTRecord(signed.key, signed.subkey, validator.sign_value(signed), signed.expiration_time)
    assert validator.validate(good)
    assert validator.strip_value(good) == record.value
    tampered = DHTRecord(good.key, good.subkey, good.value, good.expiration_time + 1)  # expiry is signed too
    assert not validator.validate(tampered)


def test_several_runs_need_run_id(two_nodes):
    coordinator, other_coordinator, first, second = two_nodes
    discovery.announce_run(first, coordinator, run_id="r1", endpoint="127.0.0.1:5000")
    discovery.announce_run(second, other_coordinator, run_id="r2", endpoint="127.0.0.1:6000")
    with pytest.raises(discovery.DiscoveryError, match="--run-id"):
        discovery.find_run(first, timeout_s=5)
    assert discovery.find_run(first, "r2", timeout_s=5).endpoint == "127.0.0.1:6000"


def test_a_joined_peer_serves_the_run_record_after_the_coordinators_node_is_gone(two_nodes):
    """Any live member of the swarm can answer for the run: the record is stored on the nodes
    nearest its key, and with two nodes that is both. A third node that bootstraps from the peer
    alone finds the run while the coordinator's node is stopped (the record lives its TTL)."""
    coordinator, _, first, second = two_nodes
    assert discovery.announce_run(first, coordinator, run_id="r1", endpoint="127.0.0.1:5000", ttl_s=60)
    discovery.stop_dht(first)
    third = discovery.start_dht(Identity.generate(), initial_peers=discovery.visible_maddrs(second), host_maddrs=LOOPBACK)
    try:
        record = discovery.find_run(third, "r1", timeout_s=10)
        assert (record.endpoint, record.coordinator_id) == ("127.0.0.1:5000", coordinator.peer_id)
        with pytest.raises(discovery.RunNotFound, match="no active coordinator record for run 'r2'"):
            discovery.find_run(third, "r2", timeout_s=0)  # one look, then the error the join's backoff retries
    finally:
        discovery.stop_dht(third)



def test_a_pinned_coordinators_lapsed_record_is_waited_for_not_called_untrusted(two_nodes):
    """A standby's record is there, the pinned active one's is not (lapsed between renewals): the
    lookup is a retryable RunNotFound naming the pinned key, not 'keys that do not vouch'."""
    active, standby, first, second = two_nodes
    discovery.announce_run(second, standby, run_id="r1", endpoint="127.0.0.1:6000")
    with pytest.raises(discovery.RunNotFound, match=f"no record of the pinned coordinator {active.peer_id[:16]}"):
        discovery.find_run(first, "r1", timeout_s=1, pinned=active.peer_id[:16])
    # Unpinned, two keys that do not list each other are still refused at once.
    discovery.announce_run(first, active, run_id="r1", endpoint="127.0.0.1:5000")
    with pytest.raises(discovery.DiscoveryError, match="do not vouch"):
        discovery.find_run(first, "r1", timeout_s=1)
