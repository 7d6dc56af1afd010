import multiprocessing
import stat

import pytest

from protocol.identity import Identity, IdentityError, peer_id_of, verify_signature
from protocol.signing import SignatureError, open_signed, sign_body


def test_identity_file_created_0600_and_reloaded(tmp_path):
    path = tmp_path / "keys" / "peer.pem"
    first = Identity.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = Identity.load_or_create(path)
    assert again.public_key == first.public_key
    assert again.peer_id == first.peer_id == peer_id_of(first.public_key)
    assert len(first.peer_id) == 32


def test_a_key_another_process_creates_first_is_the_one_both_use(tmp_path, monkeypatch):
    """Two processes starting with one --identity-path and no key yet: the second must not
    overwrite the first's key (two identities for one path) nor fail on the other's temp file."""
    path = tmp_path / "peer.pem"
    winner = Identity.generate()
    generate = Identity.generate.__func__

    def another_process_wins_the_race(cls):  # the other process links its key in between our
        with_key = Identity.load_or_create.__func__  # exists() check and our own link
        monkeypatch.setattr(Identity, "generate", classmethod(lambda _: winner))
        with_key(cls, path)
        return generate(cls)

    monkeypatch.setattr(Identity, "generate", classmethod(another_process_wins_the_race))
    loser = Identity.load_or_create(path)
    assert loser.peer_id == winner.peer_id
    assert Identity.load_or_create(path).peer_id == winner.peer_id
    assert [p.name for p in tmp_path.iterdir()] == ["peer.pem"]  # no temp file left behind


def test_processes_creating_one_key_at_once_agree_on_it(tmp_path):
    path = tmp_path / "peer.pem"
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(6), context.Queue()
    processes = [context.Process(target=_create_after_barrier, args=(barrier, str(path), results)) for _ in range(6)]
    for process in processes:
        process.start()
    try:
        ids = [results.get(timeout=60) for _ in processes]
    finally:
        for process in processes:
            process.join(timeout=10)
            process.kill()
    assert len(set(ids)) == 1 and ids[0] == Identity.load_or_create(path).peer_id
    assert [p.name for p in tmp_path.iterdir()] == ["peer.pem"]


def _create_after_barrier(barrier, path: str, results) -> None:
    barrier.wait()
    try:
        results.put(Identity.load_or_create(path).peer_id)
    except Exception as exc:  # the parent's assertion shows it
        results.put(repr(exc))


def test_corrupt_identity_file_says_what_to_do(tmp_path):
    path = tmp_path / "peer.pem"
    path.write_text("not a key")
    with pytest.raises(IdentityError, match="--identity-path"):
        Identity.load_or_create(path)


def test_signed_body_roundtrip_and_tamper():
    alice, mallory = Identity.generate(), Identity.generate()
    signed = sign_body(alice, "swarmloco/test", {"round": 3, "x": "y"})
    fields, signer = open_signed(signed, "swarmloco/test")
    assert fields == {"round": 3, "x": "y"} and signer == alice.peer_id

    tampered = type(signed)(body=signed.body.replace(b"3", b"4"), signature=signed.signature, public_key=signed.public_key)
    with pytest.raises(SignatureError) as err:
        open_signed(tampered, "swarmloco/test")
    assert err.value.reason == "bad-signature"

    forged = type(signed)(body=signed.body, signature=signed.signature, public_key=mallory.public_key)
    with pytest.raises(SignatureError):
        open_signed(forged, "swarmloco/test")

    with pytest.raises(SignatureError) as err:
        open_signed(signed, "swarmloco/other")
    assert err.value.reason == "wrong-tag"
    assert not verify_signature(b"short", b"", b"")


def test_a_kept_verification_answers_only_for_the_exact_bytes_it_checked():
    """verify_signature keeps its answers for small bodies (protocol/identity.py): once a valid
    triple is kept, a changed body, signature or key is still refused, and the same triple asked
    again (also as bytearrays) is still accepted; a body above the kept size is checked every time."""
    from protocol import identity

    alice, mallory = Identity.generate(), Identity.generate()
    body = b"header of round 7"
    signature = alice.sign(body)
    assert verify_signature(alice.public_key, signature, body)
    hits = identity._verified.cache_info().hits
    assert verify_signature(alice.public_key, signature, body)
    assert verify_signature(bytearray(alice.public_key), bytearray(signature), bytearray(body))
    assert identity._verified.cache_info().hits == hits + 2
    assert not verify_signature(alice.public_key, signature, body + b"!")
    assert not verify_signature(alice.public_key, bytes([signature[0] ^ 1]) + signature[1:], body)
    assert not verify_signature(mallory.public_key, signature, body)
    big = b"m" * (identity.CACHED_MESSAGE_BYTES + 1)
    big_signature = alice.sign(big)
    misses = identity._verified.cache_info().misses
    assert verify_signature(alice.public_key, big_signature, big) and not verify_signature(alice.public_key, big_signature, big[:-1] + b"n")
    assert identity._verified.cache_info().misses == misses


def test_a_small_order_key_signs_nothing():
    """Verification is libsodium's: the identity point as a public key with the identity point and
    S = 0 as a signature 'verifies' every message under OpenSSL's check (anyone could speak for
    that key); here it verifies none. An honest key's signatures still verify, a flipped bit not."""
    identity_point = bytes([1]) + bytes(31)
    anyone = identity_point + bytes(32)
    for message in (b"swarmloco/update-header/v5\n{}", b"anything"):
        assert not verify_signature(identity_point, anyone, message)
    me = Identity.generate()
    message = b"swarmloco/test\n" + bytes(range(256)) * 20  # past the kept-answers bound too
    signature = me.sign(message)
    assert verify_signature(me.public_key, signature, message)
    assert not verify_signature(me.public_key, bytes([signature[0] ^ 1]) + signature[1:], message)
    assert not verify_signature(me.public_key, signature, message[:-1])


def test_verification_of_what_is_not_bytes_is_false_not_an_error():
    """verify_signature never raises: a str, None or an int where bytes belong is simply not a
    valid signature (bytes(5) would have checked five zero bytes)."""
    me = Identity.generate()
    signature = me.sign(b"\x00" * 5)
    assert verify_signature(me.public_key, signature, b"\x00" * 5)
    for key, sig, message in ((me.public_key, signature, 5), (me.public_key, signature, None), (me.public_key.hex(), signature, b"x"),
                              (me.public_key, None, b"x"), (None, signature, b"x")):
        assert verify_signature(key, sig, message) is False
