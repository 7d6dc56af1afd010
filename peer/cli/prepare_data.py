"""`swarmloco prepare-data`: text files -> memory-mapped token shards + manifest (data.shards).

Reads every file of the run's corpus (data.path, or the stdlib sources; no max_corpus_bytes
cap) in blocks, splits it as the in-memory loader does (by path hash in a folder, by position in
a single file), tokenizes with the run's tokenizer (bytes, or the run's BPE, whose hash the run
config names) and streams the ids into shard files (peer/learn/token_shards.py). Nothing holds
the whole corpus, so it may be larger than RAM.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Iterator
from pathlib import Path

from peer.cli.run_flags import resolve_run_config

BLOCK_BYTES = 4 << 20  # read size; blocks are cut after a newline so tokens do not straddle them
SEPARATOR = b"\n"  # between files of a split, as peer/learn/data.py joins them


def split_files(data_cfg) -> tuple[str, list[tuple[Path, bool]] | None, Path | None]:
    """(source, [(file, is_validation)], None) for a folder or the stdlib; (source, None, file) for one file."""
    from peer.learn.data import corpus_files, is_validation_file

    source, root, files = corpus_files(data_cfg)
    if files is None:
        return source, None, root
    return source, [(f, is_validation_file(f.relative_to(root).as_posix(), data_cfg.val_fraction)) for f in files], None


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


def split_stream(parts: list[tuple[Path, int, int | None]], encode) -> Iterator[list[int]]:
    """Token ids of the given (file, start, stop) parts joined by SEPARATOR."""
    for i, (path, start, stop) in enumerate(parts):
        if i:
            yield encode(SEPARATOR)
        for block in blocks(path, start, stop):
            yield encode(block)


def main(args: argparse.Namespace) -> int:
    from peer.learn.data import load_corpus
    from peer.learn.token_shards import write_shards
    from peer.learn.tokenizer import ByteCodec, corpus_tokenizer

    cfg = resolve_run_config(args.config, {})  # a BPE run's tokenizer is trained (or loaded) here, and its hash named
    data_cfg = cfg.data if args.data is None else dataclasses.replace(cfg.data, path=args.data)
    if data_cfg.tokenizer == "bpe":
        sample = load_corpus(dataclasses.replace(data_cfg, tokenizer="bytes", shards=None))  # what the tokenizer trains on
        codec = corpus_tokenizer(data_cfg, sample.train.numpy().tobytes(), sample.digest)
        if cfg.data.tokenizer_sha256 and codec.sha256 != cfg.data.tokenizer_sha256:
            from peer.learn.tokenizer import check_tokenizer

            check_tokenizer(cfg.data, codec, sample.source)
        encode = lambda raw: codec.encode(raw.decode("utf-8", errors="replace"))  # noqa: E731
        tokenizer_json = codec.json
    else:
        codec, encode, tokenizer_json = ByteCodec(), (lambda raw: list(raw)), None  # noqa: E731
    source, files, single = split_files(data_cfg)
    if single is not None:
        size = single.stat().st_size
        cut = size - int(size * data_cfg.val_fraction)
        train_parts, val_parts = [(single, 0, cut)], [(single, cut, None)]
    else:
        train_parts = [(f, 0, None) for f, is_val in files if not is_val]
        val_parts = [(f, 0, None) for f, is_val in files if is_val]
    started = time.monotonic()
    manifest = write_shards(
        args.out, train=split_stream(train_parts, encode), val=split_stream(val_parts, encode),
        vocab_size=cfg.model.vocab_size, tokenizer=data_cfg.tokenizer, tokenizer_json=tokenizer_json,
        shard_tokens=args.shard_tokens, source=source,
    )
    train_tokens = sum(f["tokens"] for f in manifest["train"])
    val_tokens = sum(f["tokens"] for f in manifest["val"])
    print(f"prepare-data | {source} -> {args.out} | {train_tokens:,} train tokens in {len(manifest['train'])} shard(s), "
          f"{val_tokens:,} validation tokens | {manifest['dtype']} | {data_cfg.tokenizer}"
          + (f" {manifest['tokenizer_sha256'][:12]}" if tokenizer_json else "") + f" | {time.monotonic() - started:.1f} s")
    print(f"use it: [data] shards = \"{args.out}\"" + (f", tokenizer_sha256 = \"{manifest['tokenizer_sha256']}\"" if tokenizer_json else ""))
    return 0
