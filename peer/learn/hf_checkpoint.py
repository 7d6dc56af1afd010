"""Our llama as a Hugging Face checkpoint directory, both ways.

`swarmloco export` writes model.safetensors + config.json (+ tokenizer.json) that transformers
loads as its own LlamaForCausalLM; `[model] init_from = DIR` starts a run from such a directory
(transformers' save_pretrained of a Llama, or our own export): config.json gives the model's
shape, the safetensors its θ_0, tokenizer.json the run's tokenizer.

peer/learn/llama.py names its modules as LlamaForCausalLM does, so tensor names are the same on
both sides (checkpoint_tensors: a tied head is stored once, as the embedding, and lm_head.weight
is left out, as transformers does); what maps is the config: SHAPE_KEYS, config.json's key for
each ModelConfig shape field, read by init_from and written by export. Weights load as float32
(a bf16 / fp16 checkpoint upcasts exactly). A byte-level run has no tokenizer file: its token ids
are the bytes (vocab 256).

Imports no torch at module level: the run config calls in here while it is made.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from peer.run.config_errors import ConfigError
from peer.run.presets import ffn_width

# config.json key -> ModelConfig field: the model's shape, both ways.
SHAPE_KEYS: tuple[tuple[str, str], ...] = (
    ("hidden_size", "d_model"),
    ("num_hidden_layers", "n_layer"),
    ("num_attention_heads", "n_head"),
    ("num_key_value_heads", "n_kv_head"),
    ("intermediate_size", "ffn_hidden"),
    ("vocab_size", "vocab_size"),
    ("rms_norm_eps", "rms_eps"),
    ("rope_theta", "rope_theta"),
    ("tie_word_embeddings", "tie_embeddings"),
)
# What transformers' LlamaConfig assumes for a key config.json leaves out (the others are required;
# num_key_value_heads defaults to num_attention_heads, rope_theta is read by rope_theta_of).
OPTIONAL_KEYS: dict[str, Any] = {"rms_norm_eps": 1e-6, "tie_word_embeddings": False}
WEIGHTS_FILE, WEIGHTS_INDEX = "model.safetensors", "model.safetensors.index.json"
TOKENIZER_FILE = "tokenizer.json"
DERIVED_TENSORS = ("rotary_emb.inv_freq",)  # buffers older transformers saved; recomputed from rope_theta


class ExportError(ValueError):
    """The checkpoint cannot be exported as asked; the message says what to change."""


# --- the mapping -------------------------------------------------------------------------------


def hf_shape(m) -> dict[str, Any]:
    """ModelConfig `m`'s shape under config.json's keys, every default resolved."""
    from peer.learn.llama import kv_heads_of, vocab_of

    resolved = {"vocab_size": vocab_of(m), "ffn_hidden": ffn_width(m.d_model, m.ffn_hidden), "n_kv_head": kv_heads_of(m)}
    return {key: resolved.get(name, getattr(m, name)) for key, name in SHAPE_KEYS}


def checkpoint_tensors(model) -> dict[str, Any]:
    """The tensors a checkpoint of `model` holds, by name: its parameters, a tied head once (as
    model.embed_tokens.weight; named_parameters yields a shared parameter under its first name)."""
    return dict(model.named_parameters())


def hf_config(cfg) -> dict:
    """config.json of RunConfig `cfg`'s llama, as transformers' LlamaConfig reads it."""
    m = cfg.model
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **hf_shape(m),
        "head_dim": m.d_model // m.n_head,
        "max_position_embeddings": m.seq_len,
        "rope_scaling": None,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "bos_token_id": None,
        "eos_token_id": None,
    }


# --- export ------------------------------------------------------------------------------------


def export_model(model, cfg, out: str | Path, tokenizer_file: str | Path | None = None) -> Path:
    """Write `out`/model.safetensors and config.json (and tokenizer.json when given)."""
    import torch
    from safetensors.torch import save_file

    if cfg.model.arch != "llama":
        raise ExportError("only llama models export to transformers (set model.preset, e.g. llama-20m); "
                          "the byte-level gpt has no transformers class")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {name: p.detach().to(torch.float32).contiguous().cpu() for name, p in checkpoint_tensors(model).items()}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(cfg), indent=2) + "\n")
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, out / TOKENIZER_FILE)
        (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}) + "\n")
    return out


# --- init_from: reading a directory -------------------------------------------------------------


def read_hf_config(folder: Path) -> dict[str, Any]:
    where = f"model.init_from {folder}"
    if not folder.is_dir():
        raise ConfigError(f"{where}: no such directory; point it at a Hugging Face checkpoint folder "
                          "(config.json + *.safetensors, as save_pretrained or `swarmloco export` writes)")
    path = folder / "config.json"
    if not path.is_file():
        raise ConfigError(f"{where} has no config.json: is it a Hugging Face checkpoint folder? "
                          "(save_pretrained and `swarmloco export` write config.json beside the weights)")
    try:
        hf = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}: config.json is not valid JSON ({exc})") from None
    if not isinstance(hf, dict):
        raise ConfigError(f"{where}: config.json is not a JSON object")
    return hf


def rope_theta_of(hf: dict[str, Any], where: str) -> float:
    """The RoPE base: transformers 5's rope_parameters, or 4's rope_theta + rope_scaling; scaled
    variants (llama3, linear, dynamic, yarn) change the angles, which our RoPE does not."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else params
    if kind != "default":
        raise ConfigError(f"{where}: config.json asks for {kind!r} RoPE scaling; swarmloco's llama has plain RoPE "
                          "(rope_type default) only: start from a checkpoint without rope scaling")
    return float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))


def model_fields(hf: dict[str, Any], where: str) -> dict[str, Any]:
    """ModelConfig fields of a transformers Llama config.json; a ConfigError for anything our
    llama cannot hold, naming the key."""
    model_type, architectures = hf.get("model_type"), hf.get("architectures") or []
    if model_type != "llama" or any(a != "LlamaForCausalLM" for a in architectures):
        raise ConfigError(f"{where} holds a {model_type or 'model of unknown type'} model ({', '.join(architectures) or 'no architectures'}); "
                          "init_from takes a Llama-family causal LM (model_type llama, LlamaForCausalLM: RMSNorm, RoPE, SwiGLU, no biases)")
    if hf.get("quantization_config"):
        raise ConfigError(f"{where} is a quantized checkpoint; training needs the full-precision (fp32 / bf16 / fp16) weights")
    cannot = [f"{key} = {json.dumps(hf[key])} (ours: {json.dumps(want)})" for key, want in
              (("hidden_act", "silu"), ("attention_bias", False), ("mlp_bias", False)) if key in hf and hf[key] != want]
    required = [key for key, _ in SHAPE_KEYS if key not in (*OPTIONAL_KEYS, "num_key_value_heads", "rope_theta")]
    if any(key not in hf for key in required):
        raise ConfigError(f"{where}: config.json lacks {', '.join(k for k in required if k not in hf)}; a Llama config.json names each")
    sizes = {key: hf[key] for key in required}
    sizes["num_key_value_heads"] = hf.get("num_key_value_heads") or sizes["num_attention_heads"]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in sizes.values()):
        raise ConfigError(f"{where}: config.json's sizes ({', '.join(sizes)}) must be positive integers")
    d, heads, kv = sizes["hidden_size"], sizes["num_attention_heads"], sizes["num_key_value_heads"]
    if d % heads:
        cannot.append(f"hidden_size {d} is not a multiple of num_attention_heads {heads}")
    elif hf.get("head_dim") not in (None, d // heads):
        cannot.append(f"head_dim = {hf['head_dim']} (ours: hidden_size / num_attention_heads = {d // heads})")
    if heads % kv:
        cannot.append(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if cannot:
        raise ConfigError(f"{where}: swarmloco's llama cannot hold this model: " + "; ".join(cannot))
    values = {**sizes, "rms_norm_eps": float(hf.get("rms_norm_eps", OPTIONAL_KEYS["rms_norm_eps"])),
              "rope_theta": rope_theta_of(hf, where),
              "tie_word_embeddings": bool(hf.get("tie_word_embeddings", OPTIONAL_KEYS["tie_word_embeddings"]))}
    return {"arch": "llama", **{name: values[key] for key, name in SHAPE_KEYS}}


def weight_files(folder: Path, where: str) -> list[Path]:
    """The safetensors files of a checkpoint: the sharded index's, or model.safetensors."""
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError, TypeError) as exc:
            raise ConfigError(f"{where}: {WEIGHTS_INDEX} has no readable weight_map ({exc})") from None
        absent = [name for name in names if not (folder / name).is_file()]
        if absent:
            raise ConfigError(f"{where}: {WEIGHTS_INDEX} names {', '.join(absent)}, which are not there; copy every shard")
        return [folder / name for name in names]
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    if any(folder.glob("*.bin")) or any(folder.glob("*.pt")):
        raise ConfigError(f"{where} holds PyTorch pickles, not safetensors: re-save it with "
                          "model.save_pretrained(DIR, safe_serialization=True) (init_from reads safetensors only)")
    raise ConfigError(f"{where} has no {WEIGHTS_FILE} (or sharded {WEIGHTS_INDEX}): the weights are missing")


def stored_tensors(files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of every tensor in `files`, read from the safetensors headers only."""
    from safetensors import safe_open

    found = {}
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            for name in f.keys():
                piece = f.get_slice(name)
                found[name] = (tuple(piece.get_shape()), piece.get_dtype())
    return found


def expected_tensors(m) -> dict[str, tuple[int, ...]]:
    """name -> shape of the tensors a checkpoint of ModelConfig `m`'s llama holds (on the meta device)."""
    import torch

    from peer.learn.llama import LlamaLM

    with torch.device("meta"):
        return {name: tuple(p.shape) for name, p in checkpoint_tensors(LlamaLM(m)).items()}


def check_tensors(found: dict[str, tuple[tuple[int, ...], str]], m, where: str) -> None:
    """Every tensor our llama needs, in its shape, in a float dtype; nothing unknown besides."""
    expected = expected_tensors(m)
    tolerated = {"lm_head.weight"} if m.tie_embeddings else set()  # a tied head saved anyway: checked equal at load
    ignored = {name for name in found if name.endswith(DERIVED_TENSORS)} | (tolerated & set(found))

    def some(names) -> str:
        names = sorted(names)
        return ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")

    missing, extra = set(expected) - set(found), set(found) - set(expected) - ignored
    if missing:
        raise ConfigError(f"{where}: the weights lack {some(missing)}; a {m.n_layer}-layer Llama of this config.json needs "
                          f"{len(expected)} tensors. Is the checkpoint complete (every shard copied)?")
    if extra:
        raise ConfigError(f"{where}: the weights hold tensors a Llama of this config.json does not have: {some(extra)} "
                          "(biases, adapters or another architecture's modules); merge or drop them first")
    wrong = [f"{name} {list(found[name][0])} (config.json says {list(shape)})" for name, shape in expected.items()
             if found[name][0] != shape]
    if wrong:
        raise ConfigError(f"{where}: tensor shapes disagree with config.json: {'; '.join(wrong[:4])}")
    not_float = [f"{name} ({found[name][1]})" for name in expected if found[name][1] not in ("F32", "F16", "BF16", "F64")]
    if not_float:
        raise ConfigError(f"{where}: tensors that are not floating point: {', '.join(not_float[:4])}; use the unquantized weights")


_FILE_SHA256: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256: a checkpoint is hashed once per process


def file_sha256(path: Path) -> str:
    stat = path.stat()
    key = (str(path), stat.st_size, stat.st_mtime_ns)
    if key not in _FILE_SHA256:
        with path.open("rb") as f:
            _FILE_SHA256[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _FILE_SHA256[key]


def checkpoint_sha256(folder: Path, files: list[Path]) -> str:
    """sha256 over config.json's and the weight files' own hashes (the tokenizer has its own)."""
    lines = "".join(f"{path.name} {file_sha256(path)}\n" for path in [folder / "config.json", *files])
    return hashlib.sha256(lines.encode()).hexdigest()


def resolve_init_from(m) -> None:
    """Write model.init_from's shape into ModelConfig `m` (in place, as a preset is) and name the
    checkpoint (m.init_sha256); ConfigError when the directory is not a Llama we can hold or a
    shape field set beside init_from disagrees with its config.json."""
    folder = Path(m.init_from).expanduser().resolve()
    where = f"model.init_from {folder}"
    fields = model_fields(read_hf_config(folder), where)
    defaults = {f.name: f.default for f in dataclasses.fields(m)}
    hf_key = {name: key for key, name in SHAPE_KEYS}
    for name, value in fields.items():
        given = getattr(m, name)
        if given != defaults[name] and given != value:
            raise ConfigError(f"model.{name}={given!r} disagrees with {where}: its config.json has "
                              f"{hf_key.get(name, name)} = {value!r}. Drop model.{name}: init_from sets the model's shape")
        setattr(m, name, value)
    files = weight_files(folder, where)
    check_tensors(stored_tensors(files), m, where)
    m.init_from, m.init_sha256 = str(folder), checkpoint_sha256(folder, files)


def init_tokenizer(data, m):
    """DataConfig `data` with model.init_from's tokenizer.json as the run's BPE (path and hash); a
    directory without one serves a 256-token model as bytes. A config that already names the
    directory's tokenizer and its hash (the one a coordinator serves) comes back unchanged."""
    tokenizer = Path(m.init_from) / TOKENIZER_FILE
    where = f"model.init_from {m.init_from}"
    if data.tokenizer_path == str(tokenizer) and data.tokenizer_sha256:
        return data
    if not tokenizer.is_file():
        if data.tokenizer_path:
            return data  # the run owner names the tokenizer beside the checkpoint
        if m.vocab_size == 256:
            return dataclasses.replace(data, tokenizer="bytes")  # a byte-level model (our export of one has no tokenizer file)
        raise ConfigError(f"{where} has no {TOKENIZER_FILE}, and its {m.vocab_size}-token model needs its tokenizer: save it "
                          f"there (transformers: AutoTokenizer.from_pretrained(...).save_pretrained(DIR) writes {TOKENIZER_FILE}) "
                          "or name one as data.tokenizer_path")
    if data.tokenizer_path:
        raise ConfigError(f"data.tokenizer_path={data.tokenizer_path!r} and {where}/{TOKENIZER_FILE} both name the run's tokenizer: "
                          "drop data.tokenizer_path (the checkpoint's tokenizer is the one its model was trained with)")
    from peer.learn.corpus import CorpusError
    from peer.learn.tokenizer import BpeCodec

    try:
        codec = BpeCodec.from_file(tokenizer)
    except CorpusError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if codec.vocab_size > m.vocab_size:
        raise ConfigError(f"{where}: {TOKENIZER_FILE} has {codec.vocab_size} tokens but the model's vocab_size is {m.vocab_size}: "
                          "they are not one checkpoint's model and tokenizer")
    if codec.vocab_size < 512:
        raise ConfigError(f"{where}: {TOKENIZER_FILE} has {codec.vocab_size} tokens; a BPE run needs at least 512 (data.bpe_vocab_size)")
    if data.tokenizer_sha256 and data.tokenizer_sha256 != codec.sha256:
        raise ConfigError(f"data.tokenizer_sha256 {data.tokenizer_sha256[:16]}... is not {where}/{TOKENIZER_FILE}'s "
                          f"({codec.sha256[:16]}...): drop it, or use the checkpoint the run was made from")
    return dataclasses.replace(data, tokenizer="bpe", tokenizer_path=str(tokenizer), tokenizer_sha256=codec.sha256,
                               bpe_vocab_size=codec.vocab_size)


# --- init_from: loading θ_0 ----------------------------------------------------------------------


def load_init_weights(model, m) -> None:
    """Copy model.init_from's weights into `model` (built from ModelConfig `m`), IN PLACE, as
    float32; refused when the directory is no longer the checkpoint the run config names."""
    import torch
    from safetensors.torch import load_file

    folder = Path(m.init_from)
    where = f"model.init_from {folder}"
    read_hf_config(folder)  # a directory that went away says so
    files = weight_files(folder, where)
    digest = checkpoint_sha256(folder, files)
    if digest != m.init_sha256:
        raise ConfigError(f"{where} has changed since the run config was made (checkpoint sha256 {digest[:16]}..., "
                          f"the run's is {m.init_sha256[:16]}...): restore that checkpoint, or make the run config again")
    params = checkpoint_tensors(model)
    loaded, head = set(), None
    with torch.no_grad():
        for path in files:
            for name, tensor in load_file(str(path)).items():
                if name in params:
                    params[name].copy_(tensor.to(torch.float32))
                    loaded.add(name)
                elif name == "lm_head.weight" and m.tie_embeddings:
                    head = tensor.to(torch.float32)  # a tied head saved anyway: must be the embedding
    if loaded != set(params):
        raise ConfigError(f"{where}: the weights lack {', '.join(sorted(set(params) - loaded)[:4])}")
    if head is not None and not torch.equal(head, params["model.embed_tokens.weight"].detach().cpu()):
        raise ConfigError(f"{where}: tie_word_embeddings is true, but the saved lm_head.weight differs from the embedding")
