import math

import pytest
import torch

from peer.run.config import ModelConfig
from peer.learn.model import (
    GPT,
    build_model,
    flat_params,
    layout_hash,
    layout_of,
    load_flat_params,
    num_params,
    param_hash,
)

TINY = ModelConfig(seq_len=16, d_model=32, n_layer=2, n_head=4)


def test_default_param_count_matches_hand_count():
    # wte 256*128 + wpe 128*128 + per block (2 LN: 4*128, qkv 128*384+384, proj 128*128+128,
    # fc 128*512+512, proj 512*128+128) * 2 + ln_f 2*128; lm_head is tied to wte (no extra).
    block = 4 * 128 + (128 * 384 + 384) + (128 * 128 + 128) + (128 * 512 + 512) + (512 * 128 + 128)
    expected = 256 * 128 + 128 * 128 + 2 * block + 2 * 128
    model = build_model(ModelConfig(), seed=0)
    assert num_params(model) == expected == 445_952
    assert 450_000 > expected > 400_000
    assert model.lm_head.weight is model.wte.weight


def test_same_seed_same_params_different_seed_different():
    a = param_hash(flat_params(build_model(TINY, seed=7)))
    b = param_hash(flat_params(build_model(TINY, seed=7)))
    c = param_hash(flat_params(build_model(TINY, seed=8)))
    assert a == b != c
    assert len(a) == 64


def test_build_model_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_model(TINY, seed=0)
    assert torch.equal(torch.rand(3), expected)


def test_param_hash_is_sha256_of_float32_little_endian_bytes():
    import hashlib
    import struct

    flat = torch.tensor([1.0, -2.5, 0.0])
    assert param_hash(flat) == hashlib.sha256(struct.pack("<3f", 1.0, -2.5, 0.0)).hexdigest()
    assert param_hash(flat.double()) == param_hash(flat)  # always hashed as float32


def test_flat_round_trip_is_in_place_and_exact():
    model = build_model(TINY, seed=1)
    params_before = list(model.parameters())
    other = flat_params(build_model(TINY, seed=2))
    load_flat_params(model, other)
    assert torch.equal(flat_params(model), other)
    assert all(p is q for p, q in zip(model.parameters(), params_before))  # same objects
    assert flat_params(model).dtype == torch.float32 and flat_params(model).dim() == 1


def test_load_flat_params_wrong_size_says_what_is_wrong():
    model = build_model(TINY, seed=1)
    with pytest.raises(ValueError, match=r"needs \(\d+,\).*layout_hash"):
        load_flat_params(model, torch.zeros(num_params(model) + 1))


def test_layout_hash_tracks_names_and_shapes():
    a, b = build_model(TINY, seed=0), build_model(TINY, seed=5)
    assert layout_hash(a) == layout_hash(b)  # values do not matter
    wider = build_model(ModelConfig(seq_len=16, d_model=64, n_layer=2, n_head=4), seed=0)
    assert layout_hash(wider) != layout_hash(a)
    names = [name for name, _ in layout_of(a)]
    assert names[0] == "wte.weight" and "lm_head.weight" not in names
    assert sum(math.prod(shape) for _, shape in layout_of(a)) == num_params(a)


def test_loss_at_init_is_near_uniform():
    model = build_model(ModelConfig(), seed=0)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (8, 128), generator=g)
    y = torch.randint(0, 256, (8, 128), generator=g)
    logits, loss = model(x, y)
    assert logits.shape == (8, 128, 256)
    assert abs(loss.item() - math.log(256)) < 0.3


def test_causal_mask_future_token_does_not_change_past_logits():
    model = build_model(TINY, seed=3).eval()
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, 10] = (changed[:, 10] + 1) % 256
    before, _ = model(x)
    after, _ = model(changed)
    assert torch.allclose(before[:, :10], after[:, :10], atol=1e-6)
    assert not torch.allclose(before[:, 10:], after[:, 10:], atol=1e-3)


def test_too_long_input_is_refused():
    model = GPT(TINY)
    with pytest.raises(ValueError, match="model.seq_len=16"):
        model(torch.zeros(1, 17, dtype=torch.long))
