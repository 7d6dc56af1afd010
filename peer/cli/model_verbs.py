"""The verbs around real models: `prepare-data`, `export`, `sample`, `models`.

Kept apart from peer/cli/main.py, which adds them with add_model_verbs and dispatches through
HANDLERS; like every verb, each module is imported only when its verb runs (no torch at --help).
"""

from __future__ import annotations

import argparse

from peer.learn.corpus_formats import DEFAULT_TEXT_FIELD  # torch-free: --help stays fast


PREPARE_DATA_HELP = """\
Tokenize the run's corpus into memory-mapped token shards + manifest.json ([data] shards = DIR).

What --data may hold (by extension, mixed freely in a folder):
  *.jsonl, *.ndjson (.gz too)  one JSON object a line: only its --text-field is tokenized
  *.parquet                    only the --text-field column (strings), streamed by batches (needs pyarrow:
                               pip install 'swarmloco[parquet]')
  anything else                text, as bytes
A folder's text file goes to validation by a hash of its path; a .jsonl line or .parquet row by a
hash of its path and line/row; a single text file by position (its last val_fraction).

Bad input:
  a bad JSON line, a record that is not an object, no --text-field key, a text that is not a
  string, a .parquet file without that column     -> stops, naming the file and line (or column)
  a record whose text is null or ""               -> skipped, counted in the summary
  a file that is not text (binary: NUL bytes, or more than half not UTF-8)
                                                  -> refused as --data; skipped with a warning in a
                                                     folder (refused if nothing is left)
"""


def add_model_verbs(sub) -> None:
    pd = sub.add_parser("prepare-data", help="tokenize the run's corpus into memory-mapped token shards + manifest (data.shards)",
                        description=PREPARE_DATA_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    pd.add_argument("--config", metavar="RUN.toml", help="the run config (its data, tokenizer and model vocabulary)")
    pd.add_argument("--data", help="a text, .jsonl or .parquet file, or a folder mixing them (default: the config's data.path, "
                                   "else the stdlib sources)")
    pd.add_argument("--text-field", metavar="KEY",
                    help="the key of a .jsonl record, or the column of a .parquet file, that holds the text "
                         f"(default: the config's data.text_field, {DEFAULT_TEXT_FIELD!r} unless it names another)")
    pd.add_argument("--out", required=True, metavar="DIR", help="folder to write the shards, manifest.json and tokenizer.json into")
    pd.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per shard file")

    for name, help_text in (("export", "write a llama run's model as Hugging Face files (safetensors + config.json + tokenizer)"),
                            ("sample", "generate text from a run's checkpoint")):
        v = sub.add_parser(name, help=help_text)
        v.add_argument("--checkpoint", required=True, help="a checkpoint file (the coordinator's --checkpoint, or a peer's state)")
        v.add_argument("--config", help="the run config that wrote it (default: run.json beside the checkpoint)")
        if name == "export":
            v.add_argument("--out", required=True, metavar="DIR", help="output folder")
        else:
            v.add_argument("--prompt", default="def ", help="text to continue")
            v.add_argument("--max-tokens", type=int, default=100, help="tokens to generate")
            v.add_argument("--temperature", type=float, default=0.8, help="softmax temperature (0: always the most likely token)")
            v.add_argument("--top-k", type=int, default=50, help="draw among the k most likely tokens (0: all)")
            v.add_argument("--seed", type=int, default=0, help="seed of the draws")

    sub.add_parser("models", help="list the llama presets (model.preset) with their parameter counts")


def cmd_prepare_data(args: argparse.Namespace) -> int:
    from peer.cli import prepare_data

    if args.shard_tokens < 1000:
        raise ValueError(f"--shard-tokens {args.shard_tokens}: use at least 1000")
    return prepare_data.main(args)


def cmd_export(args: argparse.Namespace) -> int:
    from peer.cli import export

    return export.main(args)


def cmd_sample(args: argparse.Namespace) -> int:
    from peer.cli import sample

    return sample.main(args)


def cmd_models(args: argparse.Namespace) -> int:
    from peer.run.presets import PRESETS, describe

    print("model.preset (data.tokenizer = \"bpe\"; the default model is the byte-level gpt, 0.45M parameters):")
    for name in PRESETS:
        print("  " + describe(name))
    return 0


HANDLERS = {"prepare-data": cmd_prepare_data, "export": cmd_export, "sample": cmd_sample, "models": cmd_models}
