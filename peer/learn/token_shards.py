"""Token shards on disk: what `swarmloco prepare-data` writes and peers stream from.

A folder holds train-00000.bin, train-00001.bin, ..., val-00000.bin (raw little-endian uint16,
or uint32 for vocabularies over 65,536 tokens), manifest.json (dtype, token counts, sha256 of
every file, the tokenizer's hash) and, for BPE, tokenizer.json. Files are memory-mapped, never
read whole, so a corpus larger than RAM trains; a peer's shard (ShardSampler's contiguous 1/N
slice of the concatenated train tokens) stays a pure function of the folder and the shard index.

TokenStream is the 1-D view ShardSampler and validation_batches need: numel(), slicing into a
sub-view, and gathering (B, T + 1) windows by a tensor of positions (peer/learn/data.py).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from peer.learn.corpus import Corpus, CorpusError
from peer.learn.tokenizer import BpeCodec, check_tokenizer

FORMAT = "swarmloco-token-shards-v1"
MANIFEST = "manifest.json"


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


class TokenStream:
    """Concatenated 1-D token arrays (memory-mapped files), viewed from `start` to `stop`."""

    def __init__(self, arrays: list[np.ndarray], start: int = 0, stop: int | None = None) -> None:
        self.arrays = arrays
        self.ends = np.cumsum([len(a) for a in arrays]) if arrays else np.zeros(0, dtype=np.int64)  # exclusive ends
        total = int(self.ends[-1]) if len(self.ends) else 0
        self.start, self.stop = start, total if stop is None else stop
        if not 0 <= self.start <= self.stop <= total:
            raise ValueError(f"view [{start}, {stop}) outside a stream of {total} tokens")

    def numel(self) -> int:
        return self.stop - self.start

    def _read(self, begin: int, length: int) -> np.ndarray:
        """Tokens [begin, begin + length) of the whole stream, across file boundaries."""
        out = np.empty(length, dtype=np.int64)
        filled, pos = 0, begin
        while filled < length:
            i = int(np.searchsorted(self.ends, pos, side="right"))
            first = pos - (int(self.ends[i - 1]) if i else 0)
            take = min(length - filled, len(self.arrays[i]) - first)
            out[filled : filled + take] = self.arrays[i][first : first + take]
            filled, pos = filled + take, pos + take
        return out

    def __getitem__(self, key: Any):
        if isinstance(key, slice):
            begin, end, step = key.indices(self.numel())
            if step != 1:
                raise ValueError("a TokenStream slices with step 1 only")
            return TokenStream(self.arrays, self.start + begin, self.start + max(begin, end))
        index = torch.as_tensor(key)  # (B, T + 1) positions; each row is a contiguous window
        if index.dim() != 2:
            raise ValueError("index a TokenStream with a (B, T + 1) tensor of window positions")
        length = index.shape[1]
        rows = [self._read(self.start + int(row[0]), length) for row in index]
        return torch.from_numpy(np.stack(rows))  # (B, T + 1) int64


class ShardWriter:
    """Appends token lists to numbered files of at most `shard_tokens` tokens each."""

    def __init__(self, folder: Path, prefix: str, dtype: str, shard_tokens: int) -> None:
        self.folder, self.prefix, self.dtype, self.shard_tokens = folder, prefix, np.dtype(dtype), shard_tokens
        self.files: list[dict[str, Any]] = []
        self.handle = None

    def _open(self) -> None:
        name = f"{self.prefix}-{len(self.files):05d}.bin"
        self.handle = open(self.folder / name, "wb")
        self.files.append({"file": name, "tokens": 0, "sha256": hashlib.sha256()})

    def write(self, ids) -> None:
        """Append a list or array of token ids."""
        array = np.asarray(ids, dtype=self.dtype)
        while len(array):
            if self.handle is None or self.files[-1]["tokens"] >= self.shard_tokens:
                self._close_current()
                self._open()
            room = self.shard_tokens - self.files[-1]["tokens"]
            part, array = array[:room], array[room:]
            raw = part.astype(self.dtype.newbyteorder("<"), copy=False).tobytes()
            self.handle.write(raw)
            self.files[-1]["sha256"].update(raw)
            self.files[-1]["tokens"] += len(part)

    def _close_current(self) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None

    def close(self) -> list[dict[str, Any]]:
        self._close_current()
        return [{**f, "sha256": f["sha256"].hexdigest()} for f in self.files]


def write_shards(folder: str | Path, *, pieces: Iterable[tuple[str, Any]], vocab_size: int,
                 tokenizer: str, tokenizer_json: str | None, shard_tokens: int, source: str) -> dict[str, Any]:
    """Stream ("train" | "val", token ids) pieces into `folder`, both splits in one pass (a .jsonl
    file's records go to either); returns (and writes) the manifest."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MANIFEST).unlink(missing_ok=True)  # a run that stops half-way leaves no manifest naming old files
    dtype = dtype_for(vocab_size)
    writers = {name: ShardWriter(folder, name, dtype, shard_tokens) for name in ("train", "val")}
    for name, ids in pieces:
        writers[name].write(ids)
    splits = {name: writer.close() for name, writer in writers.items()}
    manifest = {
        "format": FORMAT, "dtype": dtype, "vocab_size": vocab_size, "tokenizer": tokenizer, "source": source,
        "tokenizer_sha256": hashlib.sha256(tokenizer_json.encode()).hexdigest() if tokenizer_json else "",
        "train": splits["train"], "val": splits["val"],
    }
    if tokenizer_json:
        (folder / "tokenizer.json").write_text(tokenizer_json)
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def read_manifest(folder: str | Path) -> dict[str, Any]:
    path = Path(folder).expanduser() / MANIFEST
    if not path.exists():
        raise CorpusError(f"data.shards {folder}: no {MANIFEST}; write the folder with `swarmloco prepare-data --out {folder}`")
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise CorpusError(f"data.shards {folder}: {MANIFEST} is not a {FORMAT} manifest; run prepare-data again")
    return manifest


def open_shards(cfg) -> Corpus:
    """The Corpus of DataConfig `cfg` with data.shards set: memory-mapped train and val streams."""
    folder = Path(cfg.shards).expanduser()
    manifest = read_manifest(folder)
    if manifest["tokenizer"] != cfg.tokenizer:
        raise CorpusError(f"data.shards {folder} holds {manifest['tokenizer']} tokens but data.tokenizer is {cfg.tokenizer!r}")
    codec = None
    if cfg.tokenizer == "bpe":
        codec = BpeCodec.from_file(folder / "tokenizer.json")
        check_tokenizer(cfg, codec, f"the shards in {folder}")

    def stream(entries: list[dict[str, Any]]) -> TokenStream:
        arrays = []
        for entry in entries:
            path = folder / entry["file"]
            expected = entry["tokens"] * np.dtype(manifest["dtype"]).itemsize
            if not path.exists() or path.stat().st_size != expected:
                raise CorpusError(f"{path} is missing or not {expected} bytes long; copy the shard folder again or rerun prepare-data")
            arrays.append(np.memmap(path, dtype=np.dtype(manifest["dtype"]).newbyteorder("<"), mode="r"))
        return TokenStream(arrays)

    digest = hashlib.sha256(json.dumps([manifest["train"], manifest["val"]], sort_keys=True).encode()).hexdigest()
    return Corpus(train=stream(manifest["train"]), val=stream(manifest["val"]), source=f"shards:{folder}",
                  files=len(manifest["train"]) + len(manifest["val"]), digest=digest, tokenizer=codec)
