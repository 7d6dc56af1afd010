"""What every corpus source hands the trainer: a Corpus (train and validation token streams, where
they came from, a digest), and the one error a user's data can raise.

The lowest floor of peer/learn's data modules: tokenizer.py and token_shards.py build a Corpus,
data.py picks which of them to call and samples from the result; none of them is imported here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class CorpusError(ValueError):
    """The training text cannot be used; the message says what to change."""


@dataclass
class Corpus:
    # (n,) token streams: uint8 tensors of bytes, int32 tensors of BPE ids, or memory-mapped
    # TokenStreams (token_shards.py). Shared by every caller of load_corpus: do not modify.
    train: Any
    val: Any
    source: str  # where it came from, for logs: "python-stdlib:/usr/lib/python3.11" or the path
    files: int  # files read (at least partly)
    digest: str = ""  # sha256 over both splits: equal digests mean comparable val losses
    tokenizer: Any = None  # data.tokenizer bpe: the BpeCodec whose token ids train/val hold (else bytes)
