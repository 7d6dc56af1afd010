import hashlib

import pytest
import torch

from peer.run.config import DataConfig
from peer.learn.data import (
    CorpusError,
    ShardSampler,
    is_validation_file,
    load_corpus,
    shard_for_peer,
    stdlib_sources,
    validation_batches,
)


def _write_files(root, count: int, size: int = 400) -> dict[str, bytes]:
    files = {}
    for i in range(count):
        rel = f"sub{i % 3}/file{i:03d}.txt"
        text = (f"file {i}: " + "abcdefghij" * size)[:size].encode()
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(text)
        files[rel] = text
    return files


def test_split_rule_is_sha256_of_relative_path():
    rel = "json/decoder.py"
    bucket = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big") % 1000
    assert is_validation_file(rel, 0.1) == (bucket < 100)
    # Raising the fraction only moves files into validation, never out of it.
    names = [f"f{i}.py" for i in range(500)]
    small = {n for n in names if is_validation_file(n, 0.1)}
    large = {n for n in names if is_validation_file(n, 0.3)}
    assert small <= large and 20 < len(small) < 80


def test_stdlib_corpus_is_split_disjointly_and_capped():
    cfg = DataConfig(max_corpus_bytes=1_000_000)
    corpus = load_corpus(cfg, seq_len=128)
    assert corpus.train.dtype == torch.uint8 and corpus.val.dtype == torch.uint8
    assert corpus.source.startswith("python-stdlib:")
    assert corpus.train.numel() <= 900_000 and corpus.val.numel() <= 100_000
    assert corpus.train.numel() > 800_000 and corpus.val.numel() > 50_000  # budgets are actually used
    assert load_corpus(cfg) is corpus  # cached per process
    root, files = stdlib_sources()
    rels = [p.relative_to(root).as_posix() for p in files]
    assert rels == sorted(rels) and all("site-packages" not in r for r in rels)
    assert all(r.endswith(".py") for r in rels)
    # The first validation file's text sits in val, not in train (disjoint splits).
    first_val = next(p for p, r in zip(files, rels) if is_validation_file(r, cfg.val_fraction))
    snippet = first_val.read_bytes()[:200]
    assert bytes(corpus.val[:200].tolist()) == snippet
    assert snippet not in bytes(corpus.train.tolist())


def test_data_directory_of_files(tmp_path):
    files = _write_files(tmp_path, 60)
    corpus = load_corpus(DataConfig(path=str(tmp_path), val_fraction=0.2), seq_len=32)
    val_rels = sorted(r for r in files if is_validation_file(r, 0.2))
    train_rels = sorted(r for r in files if not is_validation_file(r, 0.2))
    assert corpus.files == 60
    assert bytes(corpus.val.tolist()) == b"\n".join(files[r] for r in val_rels)
    assert bytes(corpus.train.tolist()) == b"\n".join(files[r] for r in train_rels)


def test_single_file_is_split_by_position(tmp_path):
    path = tmp_path / "book.txt"
    text = ((bytes(range(32, 127)) + b"\n") * 107)[:10240]  # 10240 bytes of text (binary bytes are refused)
    path.write_bytes(text)
    corpus = load_corpus(DataConfig(path=str(path), val_fraction=0.25), seq_len=64)
    assert bytes(corpus.train.tolist()) == text[:7680]
    assert bytes(corpus.val.tolist()) == text[7680:]


def test_missing_path_and_empty_corpus_give_clear_errors(tmp_path):
    with pytest.raises(CorpusError, match="no such file or directory"):
        load_corpus(DataConfig(path=str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="holds no files"):
        load_corpus(DataConfig(path=str(tmp_path / "empty")))
    (tmp_path / "zeros").mkdir()
    (tmp_path / "zeros" / "a.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(DataConfig(path=str(tmp_path / "zeros")))


def test_too_small_split_says_what_to_change(tmp_path):
    (tmp_path / "tiny.txt").write_bytes(b"x" * 300)
    with pytest.raises(CorpusError, match="lower data.val_fraction"):
        load_corpus(DataConfig(path=str(tmp_path / "tiny.txt"), val_fraction=0.5), seq_len=200)


def test_shards_are_disjoint_contiguous_and_deterministic():
    data = torch.arange(1000, dtype=torch.int64) % 256
    data = data.to(torch.uint8)
    seen = []
    for shard in range(4):
        sampler = ShardSampler(data, shard=shard, num_shards=4, batch_size=16, seq_len=10, seed=0)
        assert torch.equal(sampler.shard_data, data[shard * 250 : (shard + 1) * 250])
        again = ShardSampler(data, shard=shard, num_shards=4, batch_size=16, seq_len=10, seed=0)
        for _ in range(5):
            x, y = sampler.next_batch()
            x2, y2 = again.next_batch()
            assert torch.equal(x, x2) and torch.equal(y, y2)
            assert x.shape == y.shape == (16, 10) and x.dtype == torch.long
            assert torch.equal(y[:, :-1], x[:, 1:])  # y is x shifted by one byte
        seen.append(sampler)
    # Windows of shard k lie inside bytes [250k, 250k + 250): positions identify the shard
    # (data[i] = i mod 256, so consecutive bytes differ by 1 and the first byte fixes the window).
    for shard, sampler in enumerate(seen):
        x, _ = sampler.next_batch()
        starts = x[:, 0]
        lo, hi = shard * 250, shard * 250 + 250 - 10
        allowed = {i % 256 for i in range(lo, hi)}
        assert set(starts.tolist()) <= allowed


def test_sampler_seed_changes_stream():
    data = torch.randint(0, 256, (5000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    a = ShardSampler(data, shard=0, num_shards=1, batch_size=4, seq_len=8, seed=0).next_batch()[0]
    b = ShardSampler(data, shard=0, num_shards=1, batch_size=4, seq_len=8, seed=1).next_batch()[0]
    assert not torch.equal(a, b)


def test_sampler_state_round_trip_continues_identical_stream():
    data = torch.randint(0, 256, (5000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    make = lambda: ShardSampler(data, shard=1, num_shards=3, batch_size=4, seq_len=8, seed=9)  # noqa: E731
    original = make()
    for _ in range(7):
        original.next_batch()
    state = original.state_dict()
    expected = [original.next_batch() for _ in range(3)]
    resumed = make()
    resumed.load_state_dict(state)
    for x, y in expected:
        rx, ry = resumed.next_batch()
        assert torch.equal(rx, x) and torch.equal(ry, y)
    assert resumed.batches_drawn == 10
    wrong = ShardSampler(data, shard=2, num_shards=3, batch_size=4, seq_len=8, seed=9)
    with pytest.raises(ValueError, match="same run config"):
        wrong.load_state_dict(state)


def test_shard_too_small_says_what_to_change():
    with pytest.raises(CorpusError, match="fewer shards"):
        ShardSampler(torch.zeros(100, dtype=torch.uint8), shard=0, num_shards=10, batch_size=1, seq_len=16, seed=0)


def test_shard_for_peer_is_stable_and_spreads():
    assert shard_for_peer("abc", 7) == int.from_bytes(hashlib.sha256(b"abc").digest()[:8], "big") % 7
    shards = {shard_for_peer(f"peer-{i}", 4) for i in range(40)}
    assert shards == {0, 1, 2, 3}
    with pytest.raises(ValueError):
        shard_for_peer("abc", 0)


def test_validation_batches_are_fixed_and_evenly_spaced(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(bytes(32 + i % 95 for i in range(20_000)))  # printable: a file of binary bytes is refused
    corpus = load_corpus(DataConfig(path=str(path), val_fraction=0.5), seq_len=16)
    batches = validation_batches(corpus, batch_size=2, seq_len=16, count=3)
    assert len(batches) == 3
    again = validation_batches(corpus, batch_size=2, seq_len=16, count=3)
    for (x, y), (x2, y2) in zip(batches, again):
        assert torch.equal(x, x2) and torch.equal(y, y2) and x.shape == (2, 16)
    # 6 windows at offsets floor(k * 9983 / 5), k = 0..5, into val = bytes 10000..19999
    # (9983 = 10000 - seq_len - 1, the last valid offset); byte i of the file is 32 + i mod 95.
    offsets = [0, 1996, 3993, 5989, 7986, 9983]
    firsts = [int(x[r, 0]) for x, _ in batches for r in range(2)]
    assert firsts == [32 + (10_000 + o) % 95 for o in offsets]
