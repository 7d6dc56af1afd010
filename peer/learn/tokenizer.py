"""Tokenizers: bytes (the default: ids are the bytes, nothing to agree on) or a byte-level BPE
trained here with the `tokenizers` package on the run's corpus (or shipped by the run owner
as data.tokenizer_path).

Every peer must cut text into the same tokens, so a BPE run names its tokenizer in the run config
(data.tokenizer_sha256, the sha256 of its canonical JSON; filled in when the run config is loaded,
see with_tokenizer_hash in peer/learn/data.py). A peer trains or loads its own copy and refuses to
start when the hash differs (another corpus, e.g. another Python version's stdlib, or another
tokenizers release): TokenizerMismatch says which file to fetch instead. Training is deterministic:
the same corpus bytes and vocabulary size give the same merges (tests/test_tokenizer.py).

Trained tokenizers and encoded splits are cached under $SWARMLOCO_CACHE (default
~/.cache/swarmloco), keyed by what made them, so the coordinator and peers on one machine train once.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from peer.learn.corpus import Corpus, CorpusError

CACHE_VERSION = "swarmloco-bpe-v1"
CHUNK_CHARS = 1 << 16  # text is cut after a newline into pieces of about this size, for batch encoding


class TokenizerMismatch(CorpusError):
    """This peer's tokenizer is not the run's; the message says what to do."""


def cache_dir() -> Path:
    path = Path(os.environ.get("SWARMLOCO_CACHE") or Path.home() / ".cache" / "swarmloco")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def text_chunks(data: bytes) -> Iterator[str]:
    """The corpus bytes as UTF-8 text (invalid bytes replaced) in newline-cut pieces."""
    text = data.decode("utf-8", errors="replace")
    start = 0
    while start < len(text):
        cut = text.find("\n", start + CHUNK_CHARS)
        stop = len(text) if cut < 0 else cut + 1
        yield text[start:stop]
        start = stop


class BpeCodec:
    """A trained byte-level BPE: encode(str) -> ids, decode(ids) -> str, its sha256 and file text."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.json = tokenizer.to_str()
        self.sha256 = hashlib.sha256(self.json.encode()).hexdigest()
        self.vocab_size = tokenizer.get_vocab_size()

    @classmethod
    def from_file(cls, path: str | Path) -> "BpeCodec":
        from tokenizers import Tokenizer

        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as exc:
            raise CorpusError(f"data.tokenizer_path {path}: not a tokenizers JSON file ({exc})") from None

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text).ids

    def encode_chunks(self, chunks: Iterable[str]) -> Iterator[list[int]]:
        batch: list[str] = []
        for chunk in chunks:
            batch.append(chunk)
            if len(batch) == 64:
                yield from (e.ids for e in self.tokenizer.encode_batch(batch))
                batch = []
        if batch:
            yield from (e.ids for e in self.tokenizer.encode_batch(batch))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)


class ByteCodec:
    """data.tokenizer = "bytes": token ids are the UTF-8 bytes."""

    sha256 = ""
    vocab_size = 256

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")


def train_bpe(chunks: Iterable[str], vocab_size: int) -> BpeCodec:
    """A byte-level BPE (GPT-2 style pre-tokenization, all 256 bytes in the alphabet) of
    `vocab_size` tokens, trained on `chunks`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False, special_tokens=[]
    )
    tokenizer.train_from_iterator(chunks, trainer=trainer)
    return BpeCodec(tokenizer)


def corpus_tokenizer(cfg, train_bytes: bytes, corpus_digest: str) -> BpeCodec:
    """The run's BPE for DataConfig `cfg`: data.tokenizer_path, else trained on the train split
    (cached by corpus digest and vocabulary size)."""
    if cfg.tokenizer_path:
        path = Path(cfg.tokenizer_path).expanduser()
        if not path.exists():
            raise CorpusError(f"data.tokenizer_path {path} does not exist; get the run's tokenizer.json from the run owner")
        return BpeCodec.from_file(path)
    import tokenizers

    key = hashlib.sha256(f"{CACHE_VERSION}:{tokenizers.__version__}:{corpus_digest}:{cfg.bpe_vocab_size}".encode()).hexdigest()[:24]
    cached = cache_dir() / f"bpe-{key}.json"
    if cached.exists():
        return BpeCodec.from_file(cached)
    codec = train_bpe(text_chunks(train_bytes), cfg.bpe_vocab_size)
    write_atomic_text(cached, codec.json)
    return codec


def check_tokenizer(cfg, codec: BpeCodec, source: str) -> None:
    """Refuse a tokenizer that is not the run's (when the run config names one)."""
    if cfg.tokenizer_sha256 and codec.sha256 != cfg.tokenizer_sha256:
        how = f"loaded from {cfg.tokenizer_path}" if cfg.tokenizer_path else f"trained on {source}"
        raise TokenizerMismatch(
            f"this peer's BPE tokenizer ({how}) has sha256 {codec.sha256[:16]}..., but the run's is "
            f"{cfg.tokenizer_sha256[:16]}...: its tokens would not match the swarm's. Your copy of the corpus differs "
            "(another data folder, or another Python version's stdlib) or so does your tokenizers release; get the run's "
            "tokenizer.json from the run owner and pass it as data.tokenizer_path (or use the run's --data)"
        )


def encode_corpus(cfg, corpus):
    """The byte Corpus `corpus` as BPE token ids (int32 tensors), checked against the run's
    hash; encoded splits are cached as .npy beside the tokenizer and memory-mapped back."""
    import numpy as np
    import torch

    codec = corpus_tokenizer(cfg, corpus.train.numpy().tobytes(), corpus.digest)
    check_tokenizer(cfg, codec, corpus.source)
    splits = {}
    for name in ("train", "val"):
        path = cache_dir() / f"tokens-{hashlib.sha256(f'{corpus.digest}:{codec.sha256}:{name}'.encode()).hexdigest()[:24]}.npy"
        if not path.exists():
            ids = [i for piece in codec.encode_chunks(text_chunks(getattr(corpus, name).numpy().tobytes())) for i in piece]
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npy")
            np.save(tmp, np.asarray(ids, dtype=np.int32))
            os.replace(tmp, path)
        splits[name] = torch.from_numpy(np.array(np.load(path, mmap_mode="r")))  # (n,) int32
    digest = hashlib.sha256(f"{corpus.digest}:{codec.sha256}".encode()).hexdigest()
    return Corpus(train=splits["train"], val=splits["val"], source=f"{corpus.source} (bpe {codec.sha256[:12]})",
                  files=corpus.files, digest=digest, tokenizer=codec)
