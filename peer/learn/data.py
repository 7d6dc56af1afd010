"""Training text: the corpus, each peer's shard of it, and the fixed validation batches.

Default corpus: the Python standard library's own `.py` sources on this machine (real text,
offline, nobody here wrote it). `data.path` may instead name a file or a directory of text,
.jsonl and .parquet files (peer/learn/corpus_formats.py: only a record's text field is read, and a
file that is not text is refused, or skipped in a folder).

Split. In a directory, a file is validation iff sha256(relative path) mod 1000 is below
val_fraction * 1000: stable across machines and runs, and disjoint by construction (a file is
never in both splits). A single file is split by position instead: its last val_fraction of
bytes is validation (a hash would put the whole file on one side). A .jsonl or .parquet file is
split by record instead, wherever it is: a line or row is validation iff the same hash of
"relative path#line" (or "#row") says so, so one big file still feeds both splits.

Cap. At most max_corpus_bytes are read, split proportionally: validation gets
int(max_corpus_bytes * val_fraction) bytes and train the rest; files are taken in sorted
path order and each goes to its split until that split's budget is spent (the last file is
truncated). So the cap never starves one side, and startup stays well under a second.

Each split is the concatenation of its files and records, separated by b"\\n", as a (n,) uint8 tensor.

Note: on different Python versions the stdlib differs, so two machines can hold different
default corpora; `Corpus.digest` tells them apart (compare it before comparing val losses).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sysconfig
from pathlib import Path
from typing import Any

import torch

from peer.learn.corpus import Corpus, CorpusError
from peer.learn.corpus_formats import SAMPLE_BYTES, ReadStats, file_format, split_records
from peer.learn.token_shards import open_shards
from peer.learn.tokenizer import encode_corpus
from peer.run.config import DataConfig

SEPARATOR = b"\n"
_EXCLUDED_DIRS = {"site-packages", "dist-packages", "__pycache__"}


# --- loading -------------------------------------------------------------------------------

_CACHE: dict[tuple, Corpus] = {}


def load_corpus(cfg: DataConfig, *, seq_len: int | None = None, text_field: str | None = None) -> Corpus:
    """Read (once per process, then cached) and split the corpus named by cfg.

    data.shards: memory-mapped token files (peer/learn/token_shards.py); data.tokenizer bpe: the
    bytes encoded by the run's BPE (peer/learn/tokenizer.py), whose hash must be the run's.
    text_field: the key of a .jsonl record (the column of a .parquet file) that holds its text
    (default: the run's data.text_field, so every peer reads the same field).
    With seq_len, also check that both splits hold at least one (seq_len + 1)-token window."""
    text_field = text_field or cfg.text_field
    key = (cfg.path, cfg.val_fraction, cfg.max_corpus_bytes, cfg.shards, cfg.tokenizer, cfg.tokenizer_path,
           cfg.tokenizer_sha256, cfg.bpe_vocab_size, text_field)
    corpus = _CACHE.get(key)
    if corpus is None:
        if cfg.shards:
            corpus = open_shards(cfg)
        elif cfg.tokenizer == "bpe":
            corpus = encode_corpus(cfg, _read_corpus(cfg, text_field))
        else:
            corpus = _read_corpus(cfg, text_field)
        _CACHE[key] = corpus
    if seq_len is not None:
        check_split_size(corpus.train, seq_len, "train", corpus.source)
        check_split_size(corpus.val, seq_len, "validation", corpus.source)
    return corpus


def with_tokenizer_hash(cfg):
    """A RunConfig whose BPE tokenizer hash is filled in (trained or loaded here, once);
    byte-level configs and configs that already name a hash come back unchanged."""
    data = cfg.data
    if data.tokenizer != "bpe" or data.tokenizer_sha256:
        return cfg
    codec = load_corpus(data).tokenizer
    return dataclasses.replace(cfg, data=dataclasses.replace(data, tokenizer_sha256=codec.sha256))


def check_split_size(split: torch.Tensor, seq_len: int, name: str, source: str) -> None:
    if split.numel() < seq_len + 1:
        raise CorpusError(
            f"the {name} split of {source} has {split.numel()} bytes, fewer than seq_len + 1 = {seq_len + 1}: "
            "add more text or lower data.val_fraction"
            + (" (or raise it, if the validation split is the empty one)" if name == "validation" else "")
        )


def stdlib_sources() -> tuple[Path, list[Path]]:
    """The stdlib root and its .py files (site-/dist-packages excluded), sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in _EXCLUDED_DIRS]  # prune: never descend
        found.extend(Path(dirpath, f) for f in filenames if f.endswith(".py"))
    return root, sorted(found, key=lambda p: p.relative_to(root).as_posix())


def is_validation_file(relative_path: str, val_fraction: float) -> bool:
    """Stable split by path: sha256 (not Python's salted hash) of the posix relative path."""
    bucket = int.from_bytes(hashlib.sha256(relative_path.encode()).digest()[:8], "big") % 1000
    return bucket < round(val_fraction * 1000)


def corpus_files(cfg: DataConfig) -> tuple[str, Path, list[Path] | None]:
    """(source, root, files sorted by relative path) of cfg's corpus; files is None when
    data.path names a single file (root is then that file)."""
    if cfg.path is None:
        root, files = stdlib_sources()
        return f"python-stdlib:{root}", root, files
    root = Path(cfg.path).expanduser()
    if not root.exists():
        raise CorpusError(f"--data {cfg.path}: no such file or directory; pass a text file or a folder of them")
    if root.is_file():
        return str(root), root, None
    if not root.is_dir():
        raise CorpusError(f"--data {cfg.path} is neither a regular file nor a directory")
    files = sorted(
        (Path(d, f) for d, _, names in os.walk(root) for f in names if Path(d, f).is_file()),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    return str(root), root, files


def _read_corpus(cfg: DataConfig, text_field: str) -> Corpus:
    source, root, files = corpus_files(cfg)
    stats = ReadStats(source)
    if files is None:
        if file_format(root) == "text":
            return _split_single_file(root, cfg, stats)
        root, files = root.parent, [root]  # one .jsonl/.parquet file: split by record, as in a folder
    if not files:
        raise CorpusError(f"{source} holds no files to read; point --data at a text file or a folder of them")

    val_budget = int(cfg.max_corpus_bytes * cfg.val_fraction)
    budgets = {True: val_budget, False: cfg.max_corpus_bytes - val_budget}  # keyed by is_validation
    parts: dict[bool, list[bytes]] = {True: [], False: []}

    def take(is_val: bool, piece: bytes) -> None:
        parts[is_val].append(piece[: budgets[is_val]])
        budgets[is_val] -= len(piece) + len(SEPARATOR)

    is_val_key = lambda key: is_validation_file(key, cfg.val_fraction)  # noqa: E731
    used = 0
    for path in files:
        if budgets[True] <= 0 and budgets[False] <= 0:
            break
        relative = path.relative_to(root).as_posix()
        if file_format(path) != "text":
            took = False
            for is_val, text in split_records(path, relative, text_field, is_val_key, stats):
                if budgets[is_val] > 0:
                    take(is_val, text)
                    took = True
                elif budgets[not is_val] <= 0:
                    break
            used += took
            continue
        is_val = is_val_key(relative)
        if budgets[is_val] <= 0:
            continue
        with open(path, "rb") as handle:
            chunk = handle.read(budgets[is_val])
            head = chunk if len(chunk) >= SAMPLE_BYTES else chunk + handle.read(SAMPLE_BYTES - len(chunk))
        if not chunk or not stats.admit_text(path, head, single=False):
            continue
        stats.files["text"] += 1
        take(is_val, chunk)
        used += 1
    stats.finish()
    if used == 0:
        raise CorpusError(f"{source} is empty (every file has 0 bytes, or every record an empty text); add some text")
    return _make_corpus(SEPARATOR.join(parts[False]), SEPARATOR.join(parts[True]), source, used)


def _split_single_file(path: Path, cfg: DataConfig, stats: ReadStats) -> Corpus:
    with open(path, "rb") as handle:
        text = handle.read(cfg.max_corpus_bytes)
    if not text:
        raise CorpusError(f"--data {path} is empty; add some text")
    stats.admit_text(path, text[:SAMPLE_BYTES], single=True)
    cut = len(text) - int(len(text) * cfg.val_fraction)
    return _make_corpus(text[:cut], text[cut:], str(path), 1)


def _make_corpus(train: bytes, val: bytes, source: str, files: int) -> Corpus:
    digest = hashlib.sha256()
    for split in (train, val):
        digest.update(len(split).to_bytes(8, "little"))
        digest.update(split)

    def as_tensor(raw: bytes) -> torch.Tensor:
        # bytearray: torch.frombuffer wants a writable buffer; (n,) uint8.
        return torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)

    return Corpus(train=as_tensor(train), val=as_tensor(val), source=source, files=files, digest=digest.hexdigest())


# --- sampling ------------------------------------------------------------------------------


def shard_for_peer(peer_id: str, num_shards: int) -> int:
    """A peer's shard index, from sha256 of its id: stable across processes and machines."""
    if num_shards < 1:
        raise ValueError(f"num_shards={num_shards}: use at least 1")
    return int.from_bytes(hashlib.sha256(peer_id.encode()).digest()[:8], "big") % num_shards


def _windows(data: torch.Tensor, offsets: torch.Tensor, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(B,) start offsets -> x, y of shape (B, T) long, y shifted one byte ahead of x."""
    index = offsets[:, None] + torch.arange(seq_len + 1)[None, :]  # (B, T + 1)
    window = data[index].long()  # (B, T + 1)
    return window[:, :-1], window[:, 1:]


class ShardSampler:
    """Random (B, T) windows from shard `shard` of `num_shards`: the shard-th contiguous 1/N
    slice of the train bytes, so peers on different shards see different text.

    The stream is a pure function of (shard, num_shards, seed) and the data; state_dict()
    captures the position in it so a resumed peer continues exactly where it stopped."""

    def __init__(
        self, data: torch.Tensor, *, shard: int, num_shards: int, batch_size: int, seq_len: int, seed: int
    ) -> None:
        if num_shards < 1 or not 0 <= shard < num_shards:
            raise ValueError(f"shard={shard}, num_shards={num_shards}: need 0 <= shard < num_shards")
        if batch_size < 1 or seq_len < 1:
            raise ValueError(f"batch_size={batch_size}, seq_len={seq_len}: both must be positive")
        n = data.numel()
        start, stop = shard * n // num_shards, (shard + 1) * n // num_shards
        self.shard_data = data[start:stop]  # a view, no copy
        if self.shard_data.numel() < seq_len + 1:
            raise CorpusError(
                f"shard {shard} of {num_shards} has {self.shard_data.numel()} bytes, fewer than seq_len + 1 = "
                f"{seq_len + 1}: add more text, lower data.val_fraction, or use fewer shards"
            )
        self.shard, self.num_shards, self.seed = shard, num_shards, seed
        self.batch_size, self.seq_len = batch_size, seq_len
        self.batches_drawn = 0
        # One generator per (seed, shard, num_shards); sha256 so the stream is stable across hosts.
        tag = hashlib.sha256(f"swarmloco-sampler:{seed}:{shard}:{num_shards}".encode()).digest()
        self.generator = torch.Generator().manual_seed(int.from_bytes(tag[:8], "big") >> 1)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """x, y: (B, T) long, y[:, t] the byte after x[:, t]."""
        high = self.shard_data.numel() - self.seq_len  # exclusive bound on offsets
        offsets = torch.randint(0, high, (self.batch_size,), generator=self.generator)  # (B,)
        self.batches_drawn += 1
        return _windows(self.shard_data, offsets, self.seq_len)

    def state_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "num_shards": self.num_shards,
            "seed": self.seed,
            "shard_bytes": self.shard_data.numel(),
            "batches_drawn": self.batches_drawn,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        mine = (self.shard, self.num_shards, self.seed, self.shard_data.numel())
        theirs = (state["shard"], state["num_shards"], state["seed"], state["shard_bytes"])
        if mine != theirs:
            raise ValueError(
                f"sampler state is for (shard, num_shards, seed, shard_bytes)={theirs} but this sampler is {mine}; "
                "resume with the same run config and data, or start the sampler fresh"
            )
        self.batches_drawn = int(state["batches_drawn"])
        self.generator.set_state(state["generator"])


PEER_SHARDS = 16  # a peer given no --shard trains on the shard its id hashes to, among this many


def peer_sampler(cfg: DataConfig, *, seq_len: int, seed: int, peer_id: str, shard: int | None,
                 num_shards: int | None) -> tuple[ShardSampler, Corpus]:
    """What a training peer samples from: its shard of the corpus's train split (`shard` of
    `num_shards` as --shard I/N gives it, else the one its id hashes to among PEER_SHARDS), and
    the corpus (its tokenizer is what the peer says it uses when it joins)."""
    corpus = load_corpus(cfg, seq_len=seq_len)
    if shard is None or num_shards is None:
        shard, num_shards = shard_for_peer(peer_id, PEER_SHARDS), PEER_SHARDS
    sampler = ShardSampler(corpus.train, shard=shard, num_shards=num_shards, batch_size=cfg.batch_size, seq_len=seq_len, seed=seed)
    return sampler, corpus


def validation_batches(
    corpus: Corpus, batch_size: int, seq_len: int, count: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`count` fixed (x, y) batches of (B, T) long from the validation split, at evenly spaced
    offsets (no randomness), so every peer and every run measures the same val loss."""
    check_split_size(corpus.val, seq_len, "validation", corpus.source)
    windows = count * batch_size
    last = corpus.val.numel() - seq_len - 1  # last valid offset
    offsets = torch.linspace(0, last, windows, dtype=torch.float64).long()  # (count * B,)
    return [
        _windows(corpus.val, offsets[i * batch_size : (i + 1) * batch_size], seq_len) for i in range(count)
    ]


class DeviceSampler:
    """Moves each batch to the training device; state belongs to the wrapped sampler."""

    def __init__(self, sampler: ShardSampler, device: str) -> None:
        self.sampler, self.device = sampler, device

    def next_batch(self):
        x, y = self.sampler.next_batch()
        return x.to(self.device), y.to(self.device)

    def state_dict(self):
        return self.sampler.state_dict()

    def load_state_dict(self, state) -> None:
        self.sampler.load_state_dict(state)
