"""`swarmloco prepare-data`: a corpus -> memory-mapped token shards + manifest (data.shards).

Reads every file of the run's corpus (data.path, or the stdlib sources; no max_corpus_bytes
cap): text files in blocks, .jsonl and .parquet files record by record, only their text field
(peer/learn/corpus_formats.py). It splits as the in-memory loader does (a text file by path hash in
a folder, by position when alone; a record by a hash of its path and line or row), tokenizes with
the run's tokenizer (bytes, or the run's BPE, whose hash the run config names) and streams both
splits' ids into shard files in one pass (peer/learn/token_shards.py). Nothing holds the whole
corpus, so it may be larger than RAM; byte shards hold exactly what the in-memory loader reads
when the corpus fits under its cap.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

from peer.cli.run_flags import resolve_run_config

BLOCK_BYTES = 4 << 20  # read and encode size; blocks are cut after a newline so tokens do not straddle them
SEPARATOR = b"\n"  # between files and records of a split, as peer/learn/data.py joins them
SPLIT_NAME = {False: "train", True: "val"}  # keyed by is_validation


def blocks(path: Path, start: int = 0, stop: int | None = None) -> Iterator[bytes]:
    """Bytes [start, stop) of a file in newline-cut blocks of about BLOCK_BYTES."""
    with open(path, "rb") as handle:
        handle.seek(start)
        left = (stop if stop is not None else os.path.getsize(path)) - start
        carry = b""
        while left > 0:
            chunk = handle.read(min(BLOCK_BYTES, left))
            if not chunk:
                break
            left -= len(chunk)
            data = carry + chunk
            cut = data.rfind(b"\n") + 1 if left > 0 else len(data)
            if cut == 0:
                carry = data
                continue
            carry = data[cut:]
            yield data[:cut]
        if carry:
            yield carry


def corpus_pieces(root: Path, files: list[Path] | None, val_fraction: float, text_field: str,
                  stats) -> Iterator[tuple[str, bytes, bool]]:
    """(split, bytes, starts_piece) over the corpus (peer/learn/data.py's corpus_files) in file
    order: each text file's blocks (its first block starts a piece) and each non-empty record's
    text (a piece of its own)."""
    from peer.learn.corpus import CorpusError
    from peer.learn.corpus_formats import file_format, head_of, split_records
    from peer.learn.data import is_validation_file

    if files is None and file_format(root) == "text":  # one text file: split by position
        stats.admit_text(root, head_of(root), single=True)
        stats.files["text"] += 1
        size = root.stat().st_size
        cut = size - int(size * val_fraction)
        for split, start, stop in (("train", 0, cut), ("val", cut, None)):
            for i, block in enumerate(blocks(root, start, stop)):
                yield split, block, i == 0
        return
    if files is None:
        root, files = root.parent, [root]  # one .jsonl/.parquet file: split by record, as in a folder
    if not files:
        raise CorpusError(f"{stats.source} holds no files to read; point --data at a text file or a folder of them")
    is_val_key = lambda key: is_validation_file(key, val_fraction)  # noqa: E731
    for path in files:
        relative = path.relative_to(root).as_posix()
        if file_format(path) != "text":
            for is_val, text in split_records(path, relative, text_field, is_val_key, stats):
                yield SPLIT_NAME[is_val], text, True
            continue
        if path.stat().st_size == 0 or not stats.admit_text(path, head_of(path), single=False):
            continue
        stats.files["text"] += 1
        split = SPLIT_NAME[is_val_key(relative)]
        for i, block in enumerate(blocks(path)):
            yield split, block, i == 0
    stats.finish()


def encoded(pieces: Iterator[tuple[str, bytes, bool]], encode) -> Iterator[tuple[str, object]]:
    """Each split's pieces joined by SEPARATOR, encoded in buffers of about BLOCK_BYTES that end
    on a newline (after a separator or a newline-cut block)."""
    buffers = {"train": bytearray(), "val": bytearray()}
    started: set[str] = set()  # splits that hold a piece already
    for split, data, starts_piece in pieces:
        buffer = buffers[split]
        if starts_piece and split in started:
            buffer += SEPARATOR
        started.add(split)
        if len(buffer) >= BLOCK_BYTES and buffer.endswith(b"\n"):
            yield split, encode(bytes(buffer))
            buffer.clear()
        buffer += data
    for split, buffer in buffers.items():
        if buffer:
            yield split, encode(bytes(buffer))


UNNAMED = "pending"  # tokenizer_sha256 while the config loads: a placeholder, so loading trains nothing


def shard_config_and_codec(args: argparse.Namespace):
    """(run config with --data as data.path, the BPE codec or None) for these shards.

    A config that names its tokenizer's hash keeps it: this corpus must give the same tokenizer
    (or data.tokenizer_path must hold it). Otherwise the BPE is trained here on the corpus being
    prepared, its records' data.text_field (--text-field), not on data.path's text while the config loads (which is
    why the hash is a placeholder until then), and its hash goes into the config."""
    from peer.learn.data import load_corpus
    from peer.learn.tokenizer import check_tokenizer, corpus_tokenizer
    from peer.run.config import read_config_file

    overrides = {} if args.data is None else {"data.path": args.data}
    if args.text_field is not None:
        overrides["data.text_field"] = args.text_field
    named = bool(args.config and read_config_file(args.config).get("data", {}).get("tokenizer_sha256"))
    cfg = resolve_run_config(args.config, overrides if named else {**overrides, "data.tokenizer_sha256": UNNAMED})
    if cfg.data.tokenizer != "bpe":
        return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer_sha256="")), None
    # What the tokenizer trains on: the in-memory corpus (the same files, fields and splits).
    sample = load_corpus(dataclasses.replace(cfg.data, tokenizer="bytes", shards=None))
    codec = corpus_tokenizer(cfg.data, sample.train.numpy().tobytes(), sample.digest)
    if named:
        check_tokenizer(cfg.data, codec, sample.source)
        return cfg, codec
    return dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, tokenizer_sha256=codec.sha256)), codec


def main(args: argparse.Namespace) -> int:
    import numpy as np

    from peer.learn.corpus import CorpusError
    from peer.learn.corpus_formats import ReadStats
    from peer.learn.data import corpus_files
    from peer.learn.token_shards import write_shards

    cfg, codec = shard_config_and_codec(args)
    data_cfg = cfg.data
    if codec is not None:
        encode = lambda raw: codec.encode(raw.decode("utf-8", errors="replace"))  # noqa: E731
        tokenizer_json = codec.json
    else:
        encode, tokenizer_json = (lambda raw: np.frombuffer(raw, dtype=np.uint8)), None  # noqa: E731
    source, root, files = corpus_files(data_cfg)
    stats = ReadStats(source)
    started = time.monotonic()
    pieces = corpus_pieces(root, files, data_cfg.val_fraction, data_cfg.text_field, stats)
    manifest = write_shards(
        args.out, pieces=encoded(pieces, encode), vocab_size=cfg.model.vocab_size, tokenizer=data_cfg.tokenizer,
        tokenizer_json=tokenizer_json, shard_tokens=args.shard_tokens, source=source,
    )
    train_tokens = sum(f["tokens"] for f in manifest["train"])
    val_tokens = sum(f["tokens"] for f in manifest["val"])
    if train_tokens == 0:
        raise CorpusError(f"{source} holds no text to train on ({stats.summary()}); point --data at text, .jsonl or .parquet files")
    print(f"prepare-data | {source} -> {args.out} | {stats.summary()} | {train_tokens:,} train tokens in "
          f"{len(manifest['train'])} shard(s), {val_tokens:,} validation tokens | {manifest['dtype']} | {data_cfg.tokenizer}"
          + (f" {manifest['tokenizer_sha256'][:12]}" if tokenizer_json else "") + f" | {time.monotonic() - started:.1f} s")
    print(f"use it: [data] shards = \"{args.out}\"" + (f", tokenizer_sha256 = \"{manifest['tokenizer_sha256']}\"" if tokenizer_json else ""))
    return 0
