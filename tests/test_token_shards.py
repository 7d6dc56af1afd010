"""`swarmloco prepare-data`: token shards on disk that peers memory-map. Byte shards hold exactly
the in-memory corpus and the sampler draws the same windows from them; BPE shards carry the run's
tokenizer; windows that straddle shard files read right; a damaged folder is refused."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from peer.cli.main import main
from peer.learn.data import CorpusError, ShardSampler, load_corpus, validation_batches
from peer.learn.token_shards import TokenStream, open_shards
from peer.learn.tokenizer import TokenizerMismatch
from tests.helpers import bpe_config, text_folder, tiny_run_config

pytestmark = pytest.mark.usefixtures("own_cache")  # BPE training for real, not from a shared cache


def prepare(tmp_path, cfg, shard_tokens=20_000):
    (tmp_path / "run.json").write_text(cfg.to_json())
    assert main(["prepare-data", "--config", str(tmp_path / "run.json"), "--out", str(tmp_path / "shards"),
                 "--shard-tokens", str(shard_tokens)]) == 0
    return tmp_path / "shards"


def test_byte_shards_hold_the_corpus_and_sample_the_same_windows(tmp_path):
    cfg = tiny_run_config(data={"path": str(text_folder(tmp_path / "text", 0, size=120_000))})
    folder = prepare(tmp_path, cfg)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["dtype"] == "uint16" and len(manifest["train"]) > 3  # several files: windows cross them
    in_memory = load_corpus(cfg.data)
    shards = load_corpus(dataclasses.replace(cfg.data, shards=str(folder)))
    assert isinstance(shards.train, TokenStream) and all(isinstance(a, np.memmap) for a in shards.train.arrays)
    assert shards.train.numel() == in_memory.train.numel() and shards.val.numel() == in_memory.val.numel()
    whole = shards.train[torch.tensor([[0]])]  # (1, 1)
    assert whole.item() == in_memory.train[0].item()
    assert torch.equal(torch.from_numpy(shards.train._read(0, shards.train.numel())), in_memory.train.long())
    kw = dict(shard=1, num_shards=3, batch_size=4, seq_len=64, seed=7)
    a, b = ShardSampler(in_memory.train, **kw), ShardSampler(shards.train, **kw)
    for _ in range(5):
        (xa, ya), (xb, yb) = a.next_batch(), b.next_batch()
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    for (xa, _), (xb, _) in zip(validation_batches(in_memory, 4, 64, 2), validation_batches(shards, 4, 64, 2)):
        assert torch.equal(xa, xb)


def test_bpe_shards_carry_the_run_tokenizer_and_a_wrong_hash_is_refused(tmp_path):
    from peer.learn.data import with_tokenizer_hash

    cfg = with_tokenizer_hash(bpe_config(text_folder(tmp_path / "text", 0)))
    folder = prepare(tmp_path, cfg)
    corpus = open_shards(dataclasses.replace(cfg.data, shards=str(folder)))
    assert corpus.tokenizer.sha256 == cfg.data.tokenizer_sha256
    tokens = corpus.train._read(0, corpus.train.numel())
    assert int(tokens.max()) < 512 and corpus.train.numel() < 0.5 * sum(p.stat().st_size for p in (tmp_path / "text").iterdir())
    assert "def " in corpus.tokenizer.decode(tokens[:2000].tolist())
    with pytest.raises(TokenizerMismatch):
        open_shards(dataclasses.replace(cfg.data, shards=str(folder), tokenizer_sha256="0" * 64))
    (folder / manifest_file(folder)["train"][0]["file"]).write_bytes(b"\0\0")
    with pytest.raises(CorpusError, match="prepare-data"):
        open_shards(dataclasses.replace(cfg.data, shards=str(folder)))


def manifest_file(folder):
    return json.loads((folder / "manifest.json").read_text())
