"""What --data may hold: .jsonl records and .parquet rows (only their text field is tokenized, counted
to the token), text files, and folders mixing them; malformed records stop with the file, line and
what to do; random bytes and binaries are refused (skipped, with a warning, inside a folder) instead
of training a model on noise. The CLI runs as a user runs it; the files are written here."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from peer.cli.main import main
from peer.learn.corpus import CorpusError
from peer.learn.corpus_formats import head_of, not_text, record_key
from peer.learn.data import is_validation_file, load_corpus, peer_sampler, stdlib_sources
from peer.run.config import DataConfig
from tests.helpers import ROOT

pytestmark = pytest.mark.usefixtures("own_cache")
VAL_FRACTION = DataConfig().val_fraction


def prepare(tmp_path, data, *extra):
    """`swarmloco prepare-data --data DATA --out tmp_path/shards` in this process: its exit status."""
    return main(["prepare-data", "--data", str(data), "--out", str(tmp_path / "shards"), "--shard-tokens", "1000", *extra])


def shard_bytes(folder: Path, split: str) -> bytes:
    """A byte-level split's tokens, concatenated over its shard files."""
    manifest = json.loads((folder / "manifest.json").read_text())
    return b"".join(np.fromfile(folder / f["file"], dtype="<u2").astype(np.uint8).tobytes() for f in manifest[split])


def expected_splits(relative: str, texts: dict[int, str]) -> dict[str, bytes]:
    """What the loaders must make of one record file: its texts, by record key, joined per split."""
    splits: dict[str, list[bytes]] = {"train": [], "val": []}
    for key, text in texts.items():
        val = is_validation_file(record_key(relative, key), VAL_FRACTION)
        splits["val" if val else "train"].append(text.encode())
    return {name: b"\n".join(parts) for name, parts in splits.items()}


# --- round trips -----------------------------------------------------------------------------


def test_jsonl_tokenizes_only_the_text_field(tmp_path, capsys):
    texts, lines = {}, []
    for i in range(400):  # short texts beside a long padding field: the trial's file
        if i == 7:
            lines.append("")  # a blank line: skipped, not a record
        if i == 9:
            lines.append(json.dumps({"id": i, "text": None}))  # a null text: skipped and counted
            continue
        texts[len(lines) + 1] = f"def f{i}(x):  # é {i}\n    return x * {i}\n"
        lines.append(json.dumps({"id": i, "text": texts[len(lines) + 1], "padding": "·" * 300}))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("\n".join(lines) + "\n")
    assert prepare(tmp_path, corpus) == 0
    out = capsys.readouterr().out
    assert "1 jsonl file(s), 399 records (1 empty skipped)" in out, out
    want = expected_splits("corpus.jsonl", texts)
    assert want["val"] and want["train"]  # the hash split put records on both sides
    train, val = shard_bytes(tmp_path / "shards", "train"), shard_bytes(tmp_path / "shards", "val")
    assert (train, val) == (want["train"], want["val"])  # every token counted: texts and "\n" between them, nothing else
    assert b"padding" not in train + val and b'"id"' not in train + val
    assert len(train) + len(val) < corpus.stat().st_size / 10  # not the raw lines (the bug: as many tokens as bytes)
    memory = load_corpus(DataConfig(path=str(corpus)))  # what a peer's --data reads is the same text
    assert memory.train.numpy().tobytes() == want["train"] and memory.val.numpy().tobytes() == want["val"]


def test_parquet_streams_the_chosen_column_by_row_groups(tmp_path, capsys):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    bodies = [None if i == 3 else f"row {i}: ünïcode and more text " * (1 + i % 4) for i in range(300)]
    path = tmp_path / "train-00000-of-00001.parquet"
    pq.write_table(pa.table({"id": list(range(300)), "body": bodies, "meta": ["m" * 50] * 300}), path, row_group_size=64)
    assert pq.ParquetFile(path).num_row_groups == 5
    assert prepare(tmp_path, path, "--text-field", "body") == 0
    assert "1 parquet file(s), 299 records (1 empty skipped)" in capsys.readouterr().out
    want = expected_splits(path.name, {row: text for row, text in enumerate(bodies) if text})
    assert (shard_bytes(tmp_path / "shards", "train"), shard_bytes(tmp_path / "shards", "val")) == (want["train"], want["val"])
    # A peer reads the field its run names ([data] text_field, served with the run config), not a flag of its own.
    memory = load_corpus(DataConfig(path=str(path), text_field="body"))
    assert memory.train.numpy().tobytes() == want["train"]
    with pytest.raises(CorpusError, match="no 'text' column"):
        load_corpus(DataConfig(path=str(path)))
    with pytest.raises(ValueError, match="data.text_field"):
        DataConfig(text_field=" ")


def test_a_folder_mixing_formats_gives_the_shards_the_in_memory_loader_reads(tmp_path):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    folder = tmp_path / "mixed"
    (folder / "sub").mkdir(parents=True)
    for i in range(6):
        (folder / f"notes{i}.txt").write_text(f"plain text file {i}\n" * 200)
    (folder / "sub" / "code.py").write_text("def main():\n    return 0\n" * 100)
    (folder / "a.jsonl").write_text("".join(json.dumps({"text": f"record {i} " * 10, "n": i}) + "\n" for i in range(200)))
    pq.write_table(pa.table({"text": [f"parquet row {i} " * 8 for i in range(200)]}), folder / "b.parquet")
    assert prepare(tmp_path, folder) == 0
    memory = load_corpus(DataConfig(path=str(folder)))
    train, val = shard_bytes(tmp_path / "shards", "train"), shard_bytes(tmp_path / "shards", "val")
    assert train == memory.train.numpy().tobytes() and val == memory.val.numpy().tobytes()
    assert b"record 7 " in train + val and b"parquet row 9 " in train + val and b"plain text file" in train + val
    assert b'"n"' not in train + val


def test_bpe_shards_of_a_jsonl_field_train_their_tokenizer_on_that_text(tmp_path, capsys):
    """A BPE config that names no tokenizer: prepare-data trains it on --data's --text-field (not
    on the config's data.path, nor on raw JSON lines) and the shards decode to exactly that text."""
    import gzip

    from peer.learn.tokenizer import BpeCodec
    from tests.helpers import bpe_config

    texts = {i + 1: f"def step_{i}(state):\n    return state + {i % 7}\n" for i in range(1500)}
    corpus = tmp_path / "code.jsonl.gz"
    with gzip.open(corpus, "wt") as handle:
        handle.writelines(json.dumps({"body": t, "license": "mit"}) + "\n" for t in texts.values())
    (tmp_path / "run.json").write_text(bpe_config(tmp_path / "not-this-folder").to_json())
    assert prepare(tmp_path, corpus, "--config", str(tmp_path / "run.json"), "--text-field", "body") == 0
    manifest = json.loads((tmp_path / "shards" / "manifest.json").read_text())
    codec = BpeCodec.from_file(tmp_path / "shards" / "tokenizer.json")
    assert manifest["tokenizer_sha256"] == codec.sha256 and f'tokenizer_sha256 = "{codec.sha256}"' in capsys.readouterr().out
    ids = np.concatenate([np.fromfile(tmp_path / "shards" / f["file"], dtype="<u2") for f in manifest["train"]])
    assert codec.decode(ids.tolist()).encode() == expected_splits(corpus.name, texts)["train"]
    assert "license" not in codec.tokenizer.get_vocab()  # trained on the text field alone


# --- malformed records -----------------------------------------------------------------------


@pytest.mark.parametrize("lines, expected", [
    (['{"text": "ok"}', '{"text": "ok"}', '{"text": "cut off'], r"bad\.jsonl line 3: not valid JSON .*fix or delete that line"),
    (['{"text": "ok"}', '{"body": "x", "id": 2}'], r"line 2: no 'text' field \(its keys: 'body', 'id'\); .*--text-field"),
    (['["a", "list"]'], r"line 1: a JSON list, not an object with a 'text' field"),
    (['{"text": 12}'], r"line 1: 'text' is a JSON int, not a string"),
])
def test_a_malformed_jsonl_line_stops_with_the_file_and_line(tmp_path, capsys, lines, expected):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    assert prepare(tmp_path, bad) == 2
    err = capsys.readouterr().err
    assert err.startswith("swarmloco prepare-data: ") and str(bad) in err, err
    assert re.search(expected, err), err
    with pytest.raises(CorpusError, match=expected):  # a peer's --data says the same
        load_corpus(DataConfig(path=str(bad)))


def test_a_damaged_gzip_is_refused_with_its_name(tmp_path, capsys):
    (tmp_path / "part.jsonl.gz").write_bytes(b"not gzip at all\n")
    assert prepare(tmp_path, tmp_path / "part.jsonl.gz") == 2
    assert "part.jsonl.gz: not a whole gzip file" in capsys.readouterr().err


def test_a_parquet_file_without_the_column_or_not_parquet_is_refused(tmp_path, capsys):
    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({"body": ["x"], "n": [1]}), tmp_path / "t.parquet")
    assert prepare(tmp_path, tmp_path / "t.parquet") == 2
    assert "t.parquet: no 'text' column (its columns: 'body', 'n'); name the column" in capsys.readouterr().err
    assert prepare(tmp_path, tmp_path / "t.parquet", "--text-field", "n") == 2
    assert "column 'n' holds int64, not strings" in capsys.readouterr().err
    (tmp_path / "fake.parquet").write_text("id,text\n1,hello\n")
    assert prepare(tmp_path, tmp_path / "fake.parquet") == 2
    assert "fake.parquet: not a readable Parquet file" in capsys.readouterr().err


# --- not text --------------------------------------------------------------------------------


def test_random_bytes_and_a_binary_are_refused_as_the_user_runs_it(tmp_path):
    noise = tmp_path / "noise.bin"
    noise.write_bytes(os.urandom(300_000))
    run = subprocess.run([sys.executable, "-m", "peer.cli.main", "prepare-data", "--data", str(noise), "--out", str(tmp_path / "o")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert f"of the bytes in {noise} are not UTF-8 text (its first 64 KiB read" in run.stderr, run.stderr
    assert "point --data at text, .jsonl or .parquet files" in run.stderr
    assert not (tmp_path / "o" / "manifest.json").exists()
    elf = Path(os.path.realpath(sys.executable))  # a real ELF (or Mach-O) binary
    assert elf.read_bytes()[:4] in (b"\x7fELF", b"\xcf\xfa\xed\xfe", b"\xca\xfe\xba\xbe")
    for path in (noise, elf):  # what a peer's --data meets when the run's config arrives (PeerNode._build)
        with pytest.raises(CorpusError, match=r"\d+% of the bytes in .* are not UTF-8 text .*point --data at text"):
            peer_sampler(DataConfig(path=str(path)), seq_len=64, seed=0, peer_id="p", shard=None, num_shards=None)


def test_a_folder_skips_its_binaries_loudly_and_refuses_when_nothing_is_text(tmp_path, caplog, capsys):
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "README.md").write_text("# a project\n" * 500)
    (folder / "logo.png").write_bytes(b"\x89PNG\r\n\x1a\n" + os.urandom(5000))
    (folder / "notes.txt").write_bytes("texte en Latin-1: été, garçon\n".encode("latin-1") * 100)  # 8-bit text stays
    with caplog.at_level(logging.WARNING, logger="swarmloco.data"):
        assert prepare(tmp_path, folder) == 0
    assert "skipped 1 file(s) that are not text (e.g. " in caplog.text and "logo.png are not UTF-8 text" in caplog.text
    assert "1 binary file(s) skipped" in capsys.readouterr().out
    splits = {name: shard_bytes(tmp_path / "shards", name) for name in ("train", "val")}
    kept = [folder / "README.md", folder / "notes.txt"]
    for name, is_val in (("train", False), ("val", True)):
        mine = [f.read_bytes() for f in kept if is_validation_file(f.name, VAL_FRACTION) == is_val]
        assert splits[name] == b"\n".join(mine)  # the two text files, exactly; no byte of the PNG
    (folder / "README.md").write_bytes("utf-16 is not UTF-8".encode("utf-16") * 100)
    (folder / "notes.txt").unlink()
    assert prepare(tmp_path, folder) == 2
    err = capsys.readouterr().err
    assert f"--data {folder}: none of its 2 file(s) is text (e.g. " in err and "point --data at text" in err, err


def test_the_default_corpus_is_all_text(tmp_path):
    """The stdlib sources pass the check (so the default corpus is what it always was), the
    KOI8-R test module, 42% non-UTF-8, included; one not-text verdict costs microseconds."""
    _, files = stdlib_sources()
    flagged = [f for f in files if not_text(f, head_of(f))]
    assert flagged == []
    koi8 = [f for f in files if f.name == "module_koi8_r.py"]
    if koi8:
        assert not_text(koi8[0], head_of(koi8[0])) is None
    assert load_corpus(DataConfig()).files > 100

