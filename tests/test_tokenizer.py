"""The BPE tokenizer: trained here, deterministic, named by its hash in the run config; a peer
whose tokenizer differs is refused before it joins, with what to do (a real swarm on loopback)."""

from __future__ import annotations

import pytest

from peer.learn.data import load_corpus, with_tokenizer_hash
from peer.learn.tokenizer import ByteCodec, TokenizerMismatch, text_chunks, train_bpe
from peer.run.config import RunConfig
from tests.helpers import bpe_config, read_summary, text_folder

pytestmark = pytest.mark.usefixtures("own_cache")  # every test trains its tokenizer for real


def test_same_corpus_same_hash_other_corpus_other_hash(tmp_path):
    a = text_folder(tmp_path / "a", 0)
    text = b"\n".join(p.read_bytes() for p in sorted(a.iterdir()))
    first, second = train_bpe(text_chunks(text), 512), train_bpe(text_chunks(text), 512)
    assert first.sha256 == second.sha256 and first.vocab_size == 512
    assert train_bpe(text_chunks(text[: len(text) // 2]), 512).sha256 != first.sha256
    ids = first.encode("def main():\n    return 0\n")
    assert first.decode(ids) == "def main():\n    return 0\n" and len(ids) < 20  # fewer tokens than bytes
    assert ByteCodec().decode(ByteCodec().encode("héllo")) == "héllo"


def test_run_config_names_the_tokenizer_and_a_different_one_is_refused(tmp_path):
    cfg = bpe_config(text_folder(tmp_path / "a", 0))
    named = with_tokenizer_hash(cfg)
    assert len(named.data.tokenizer_sha256) == 64 and named.model.vocab_size == 512
    corpus = load_corpus(named.data, seq_len=32)
    assert corpus.tokenizer.sha256 == named.data.tokenizer_sha256
    assert corpus.train.max() < 512 and corpus.train.numel() < 150_000 // 2  # tokens, not bytes
    other = RunConfig.from_dict({**named.to_dict(), "data": {**named.to_dict()["data"], "path": str(text_folder(tmp_path / "b", 300))}})
    with pytest.raises(TokenizerMismatch, match="tokenizer_path"):
        load_corpus(other.data)


@pytest.mark.integration
def test_peer_with_another_tokenizer_is_refused_and_the_same_one_trains(swarm, tmp_path):
    cfg = bpe_config(text_folder(tmp_path / "a", 0), rounds={"rounds": 1, "expected_peers": 1}, inner={"steps": 4})
    (tmp_path / "run.json").write_text(cfg.to_json())
    coordinator = swarm.start_coordinator(["--config", str(tmp_path / "run.json")])
    stranger = swarm.start_peer("stranger", ["--data", str(text_folder(tmp_path / "b", 300))])
    assert swarm.wait(stranger, 120) != 0
    log = "".join(stranger.lines)
    assert "BPE tokenizer" in log and "tokenizer_path" in log, log[-2000:]
    peer = swarm.start_peer("peer", [])
    assert swarm.wait(coordinator, 240) == 0
    assert swarm.wait(peer, 60) == 0, "".join(peer.lines)[-2000:]
    history = read_summary(swarm, "peer")["history"]
    assert len(history) == 1 and all(h["in_sync"] for h in history)


def test_coordinator_refuses_a_join_that_names_another_tokenizer(tmp_path):
    """The peer checks its own tokenizer before it joins; the coordinator checks what the join says
    too, so a peer built without that check (or another client) is refused at join with the reason."""
    import time as _time

    from protocol.envelope import JOIN_TAG
    from protocol.identity import Identity
    from protocol.signing import sign_body
    from protocol.wire import swarm_pb2

    from tests.coordinator_harness import serve_coordinator

    cfg = with_tokenizer_hash(bpe_config(text_folder(tmp_path / "a", 0)))
    with serve_coordinator(cfg) as served:
        def join(tokenizer_sha256: str):
            body = {"run_id": cfg.run_id, "endpoint": "127.0.0.1:9", "client_mode": False, "version": "t",
                    "timestamp": _time.time(), "tokenizer_sha256": tokenizer_sha256}
            return served.stub.Join(sign_body(Identity.generate(), JOIN_TAG, body), timeout=10)

        refused = join("0" * 64)
        assert not refused.accepted and refused.refusal == swarm_pb2.WRONG_RUN and "tokenizer_path" in refused.reason
        assert join(cfg.data.tokenizer_sha256).accepted
