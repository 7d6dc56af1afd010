"""`[model] init_from = DIR` / `coordinator --init-from DIR`: a run starts from a local Hugging Face
Llama checkpoint. A tiny random LlamaForCausalLM (grouped-query attention, rms_norm_eps 1e-6, RoPE
base 5e5, tied and untied) saved by transformers with a tokenizer.json trained here: the run config
takes its shape and tokenizer, the coordinator's θ_0 is its weights and gives transformers' own
logits; `swarmloco export` of a run, started again with init_from, gives the run's logits bit for
bit; each directory swarmloco cannot start from is refused with what to do."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from peer.cli.main import build_parser, main
from peer.cli.run_flags import load_run_config, resolve_run_config
from peer.learn.model import flat_params, initial_model, param_hash
from peer.run import checkpoint
from peer.run.config import ConfigError, RunConfig
from peer.run.presets import count_params
from tests.helpers import text_folder

import transformers  # noqa: E402  (the test extra: pip install -e .[dev])

pytestmark = pytest.mark.usefixtures("one_torch_thread", "own_cache")

SHAPE = dict(vocab_size=576, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=5e5, max_position_embeddings=64, initializer_range=0.2)


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    return text_folder(tmp_path_factory.mktemp("corpus") / "text", 0, size=110_000)


@pytest.fixture(scope="module")
def tokenizer_file(corpus_dir, tmp_path_factory):
    """A 512-token byte-level BPE trained on the corpus, as a tokenizers JSON file."""
    from peer.learn.tokenizer import text_chunks, train_bpe

    text = b"".join(p.read_bytes() for p in sorted(corpus_dir.iterdir()))
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe(text_chunks(text), 512).tokenizer.save(str(path))
    return path


def save_hf_llama(folder, tokenizer_file, *, tied: bool = False, seed: int = 0, dtype=torch.float32, shard: str | None = None, **over):
    """transformers' own save_pretrained of a random tiny LlamaForCausalLM, tokenizer.json beside it."""
    config = transformers.LlamaConfig(**{**SHAPE, "tie_word_embeddings": tied, **over})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = transformers.LlamaForCausalLM(config).eval().to(dtype)
    model.save_pretrained(str(folder), **({"max_shard_size": shard} if shard else {}))
    if tokenizer_file is not None:
        shutil.copyfile(tokenizer_file, folder / "tokenizer.json")
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, tokenizer_file):
    folder = tmp_path_factory.mktemp("hf") / "llama"
    save_hf_llama(folder, tokenizer_file)
    return folder


def run_config(folder, corpus_dir, **model) -> RunConfig:
    """The run config a coordinator makes of `[model] init_from = folder` (load_run_config's path)."""
    return resolve_run_config(None, {"model.init_from": str(folder), "model.seq_len": 32, "data.path": str(corpus_dir),
                                     "data.max_corpus_bytes": 100_000, "data.val_batches": 2, "data.batch_size": 2,
                                     **{f"model.{k}": v for k, v in model.items()}})


def tokens(vocab: int = 512):
    return torch.randint(0, vocab, (2, 32), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("tied", [False, True])
def test_the_coordinator_starts_from_the_checkpoint_and_gives_transformers_logits(tmp_path, tokenizer_file, corpus_dir, tied):
    from peer.coordinator.state import Coordinator
    from peer.learn.tokenizer import BpeCodec
    from protocol.identity import Identity

    hf = save_hf_llama(tmp_path / "hf", tokenizer_file, tied=tied)
    args = build_parser().parse_args(["coordinator", "--init-from", str(tmp_path / "hf"), "--config", str(write_toml(tmp_path, corpus_dir))])
    cfg = load_run_config(args)  # what `swarmloco coordinator --init-from DIR` runs with
    m = cfg.model
    assert (m.arch, m.d_model, m.n_layer, m.n_head, m.n_kv_head, m.ffn_hidden, m.vocab_size) == ("llama", 64, 2, 4, 2, 160, 576)
    assert (m.rms_eps, m.rope_theta, m.tie_embeddings, m.init_from) == (1e-6, 5e5, tied, str((tmp_path / "hf").resolve()))
    assert len(m.init_sha256) == 64
    assert (cfg.data.tokenizer, cfg.data.tokenizer_path) == ("bpe", str((tmp_path / "hf" / "tokenizer.json").resolve()))
    assert cfg.data.tokenizer_sha256 == BpeCodec.from_file(tokenizer_file).sha256 and cfg.data.bpe_vocab_size == 512

    coordinator = Coordinator(cfg, Identity.generate())
    try:
        theirs = torch.cat([p.detach().reshape(-1) for p in dict(hf.named_parameters()).values()])
        assert coordinator.round == 0 and coordinator.params.numel() == theirs.numel() == count_params(
            d_model=64, n_layer=2, ffn_hidden=160, vocab_size=576, tie_embeddings=tied, n_head=4, n_kv_head=2)
        with torch.no_grad():
            ours, expected = coordinator.model(tokens())[0], hf(tokens()).logits
        # The same fp32 weights through another implementation of the same math (our RoPE tables and
        # repeated kv heads vs transformers' attention): bit-equal on CPU with torch 2.13 and
        # transformers 5.24, but only the math is promised, so within fp32 rounding.
        assert (ours - expected).abs().max().item() < 1e-5
        assert coordinator.param_hash == param_hash(flat_params(initial_model(m, cfg.seed)))  # θ_0 is the checkpoint's
    finally:
        coordinator.fetchers.shutdown(wait=False, cancel_futures=True)
        coordinator.channels.close()


def write_toml(tmp_path, corpus_dir):
    path = tmp_path / "run.toml"
    path.write_text(f'[model]\nseq_len = 32\n[data]\npath = "{corpus_dir}"\nmax_corpus_bytes = 100000\nval_batches = 2\nbatch_size = 2\n')
    return path


def test_the_checkpoint_is_part_of_the_run_identity_and_peers_need_no_copy(tmp_path, tokenizer_file, corpus_dir, hf_dir):
    cfg = run_config(hf_dir, corpus_dir)
    assert run_config(hf_dir, corpus_dir).config_hash() == cfg.config_hash()  # a restarted coordinator resumes its run
    save_hf_llama(tmp_path / "other", tokenizer_file, seed=1)
    other = run_config(tmp_path / "other", corpus_dir)
    assert other.model.init_sha256 != cfg.model.init_sha256 and other.config_hash() != cfg.config_hash()
    # What the coordinator serves names the checkpoint by hash: a peer rebuilds it without the directory.
    shutil.move(str(tmp_path / "other"), str(tmp_path / "gone"))
    served = RunConfig.from_json(other.to_json())
    assert served == other and served.config_hash() == other.config_hash()
    with pytest.raises(ConfigError, match="no such directory"):  # the coordinator itself cannot start from it
        initial_model(served.model, served.seed)


def test_a_sharded_bf16_checkpoint_loads_upcast_exactly(tmp_path, tokenizer_file, corpus_dir):
    hf = save_hf_llama(tmp_path / "hf", tokenizer_file, dtype=torch.bfloat16, shard="200KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists() and len(list((tmp_path / "hf").glob("*.safetensors"))) > 1
    cfg = run_config(tmp_path / "hf", corpus_dir)
    ours = dict(initial_model(cfg.model, cfg.seed).named_parameters())
    theirs = dict(hf.named_parameters())
    assert ours.keys() == theirs.keys() and all(ours[n].dtype == torch.float32 for n in ours)
    assert all(torch.equal(ours[n], theirs[n].float()) for n in ours)  # bf16 -> fp32 is exact


def test_export_of_a_run_then_init_from_gives_the_same_logits_bit_for_bit(tmp_path, hf_dir, corpus_dir):
    from peer.learn.training import InnerTrainer
    from tests.helpers import FixedSampler

    cfg = run_config(hf_dir, corpus_dir)
    model = initial_model(cfg.model, cfg.seed)
    x = tokens()
    InnerTrainer(model, cfg.inner, FixedSampler(x, x.roll(-1, dims=1))).run(2)  # a run's θ, no longer the checkpoint's
    params = flat_params(model)
    ckpt = tmp_path / "run.ckpt"
    checkpoint.save(ckpt, checkpoint.Checkpoint(round=2, params=params, param_hash=param_hash(params),
                                                config_hash=cfg.config_hash(), extra={"config": cfg.to_dict()}))
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "export")]) == 0

    again = run_config(tmp_path / "export", corpus_dir)
    assert again.data.tokenizer_sha256 == cfg.data.tokenizer_sha256  # the run's tokenizer went out and came back
    restarted = initial_model(again.model, again.seed).eval()
    model.eval()
    assert torch.equal(flat_params(restarted), params)
    with torch.no_grad():
        # Bit-exact: export writes the fp32 parameters as they are and init_from reads them back
        # into the same module code, so the same kernels see the same numbers.
        assert torch.equal(restarted(x)[0], model(x)[0])
        exported = transformers.LlamaForCausalLM.from_pretrained(str(tmp_path / "export")).eval()
        assert (exported(x).logits - model(x)[0]).abs().max().item() < 1e-5


def mutated(tmp_path, hf_dir, change) -> str:
    folder = tmp_path / "bad"
    shutil.copytree(hf_dir, folder)
    change(folder)
    return str(folder)


def edit_config(**over):
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        config.update(over)
        (folder / "config.json").write_text(json.dumps(config))
    return change


def edit_tensors(edit):
    def change(folder):
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / "model.safetensors"))
        edit(tensors)
        save_file(tensors, str(folder / "model.safetensors"))
    return change


BAD_DIRECTORIES = {
    "missing": (lambda f: shutil.rmtree(f), "no such directory"),
    "no config.json": (lambda f: (f / "config.json").unlink(), "has no config.json"),
    "not a llama": (edit_config(model_type="gpt2", architectures=["GPT2LMHeadModel"]), "Llama-family causal LM"),
    "biases": (edit_config(attention_bias=True), "cannot hold this model: attention_bias"),
    "head_dim": (edit_config(head_dim=32), "cannot hold this model: head_dim = 32"),
    "scaled rope": (edit_config(rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0}), "'llama3' RoPE scaling"),
    "quantized": (edit_config(quantization_config={"quant_method": "gptq"}), "full-precision"),
    "missing tensor": (edit_tensors(lambda t: t.pop("model.layers.1.mlp.up_proj.weight")), "lack model.layers.1.mlp.up_proj.weight"),
    "extra tensor": (edit_tensors(lambda t: t.update({"model.layers.0.self_attn.q_proj.bias": torch.zeros(64)})), "q_proj.bias"),
    "shape": (edit_config(intermediate_size=128), "shapes disagree with config.json: model.layers.0.mlp.gate_proj.weight [160, 64]"),
    "pickles": (lambda f: (f / "model.safetensors").rename(f / "pytorch_model.bin"), "safe_serialization=True"),
    "no tokenizer": (lambda f: (f / "tokenizer.json").unlink(), "no tokenizer.json, and its 576-token model needs its tokenizer"),
}


@pytest.mark.parametrize("case", list(BAD_DIRECTORIES))
def test_each_directory_it_cannot_start_from_is_refused_with_what_to_do(tmp_path, hf_dir, corpus_dir, case):
    change, message = BAD_DIRECTORIES[case]
    folder = mutated(tmp_path, hf_dir, change)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        run_config(folder, corpus_dir)


def test_fields_beside_init_from_that_disagree_and_a_changed_directory_are_refused(tmp_path, hf_dir, corpus_dir, capsys):
    with pytest.raises(ConfigError, match=r"model.d_model=96.*hidden_size = 64. Drop model.d_model"):
        RunConfig.from_dict({"model": {"init_from": str(hf_dir), "d_model": 96, "seq_len": 32}})
    with pytest.raises(ConfigError, match="drop one"):
        RunConfig.from_dict({"model": {"init_from": str(hf_dir), "preset": "llama-20m"}})
    folder = mutated(tmp_path, hf_dir, lambda f: None)
    cfg = run_config(folder, corpus_dir)
    edit_tensors(lambda t: t["model.norm.weight"].mul_(2))(tmp_path / "bad")
    with pytest.raises(ConfigError, match="has changed since the run config was made"):
        initial_model(cfg.model, cfg.seed)
    # The CLI says it in one line, before anything starts.
    assert main(["coordinator", "--init-from", str(tmp_path / "nowhere")]) == 2
    assert f"swarmloco coordinator: model.init_from {tmp_path / 'nowhere'}: no such directory" in capsys.readouterr().err
