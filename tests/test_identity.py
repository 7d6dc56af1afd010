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
