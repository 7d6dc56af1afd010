"""Heterogeneous peers, the wiring (shared/DESIGN.md, "Heterogeneous peers"): update headers sign
the work behind them (inner steps, tokens), bounded; a compute-window run weighs each row of a
slice by its capped claim, from signed headers and the manifest's history, the same everywhere;
the coordinator's ledger shows and remembers each peer's work; the window's stop hook."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from peer.node.inner_phase import window_stop
from peer.run.config import ConfigError, RunConfig
from peer.run.round_math import RoundMath
from peer.run.work_math import RowWork, WorkLedger, row_weights
from protocol.envelope import (
    EnvelopeError, ManifestEntry, RoundManifest, build_update_header, header_body, open_manifest, open_update,
    sign_manifest, sign_update, signed_to_json,
)
from protocol.identity import Identity
from protocol.keys import CoordinatorKeys
from protocol.signing import sign_body

PAYLOAD = b"\x01\x02" * 500
EXPECT = dict(run_id="run", round_=3, codec="fp16", numel=1000, layout_hash="L", max_payload_bytes=10_000,
              max_inner_steps=50, tokens_per_step=64)


def header(identity: Identity, **work):
    return build_update_header(run_id="run", round_=3, peer_id=identity.peer_id, codec="fp16", numel=1000, layout_hash="L",
                               base_param_hash="B", payload=PAYLOAD, **work)


def window_config(**rounds) -> RunConfig:
    data = RunConfig().to_dict()
    data["rounds"].update({"window_s": 2.0, **rounds})
    return RunConfig.from_dict(data)


# --- headers ---------------------------------------------------------------------------------


def test_a_header_signs_its_work_and_opens_with_it():
    me = Identity.generate()
    opened = open_update(sign_update(me, header(me, inner_steps=12, tokens=12 * 64)), **EXPECT)
    assert (opened.inner_steps, opened.tokens) == (12, 768)
    tampered = sign_update(me, header(me, inner_steps=12, tokens=768))
    tampered = type(tampered)(body=tampered.body.replace(b'"inner_steps":12', b'"inner_steps":48'),
                              signature=tampered.signature, public_key=tampered.public_key)
    with pytest.raises(EnvelopeError) as err:  # the claim is signed: changing it breaks the signature
        open_update(tampered, **EXPECT)
    assert err.value.reason == "bad-signature"


@pytest.mark.parametrize("work, message", [
    (dict(inner_steps=51, tokens=51), "claims 51 inner steps; this run allows 0 to 50"),
    (dict(inner_steps=-1, tokens=0), "claims -1 inner steps"),
    (dict(inner_steps=10, tokens=641), "claims 641 tokens for 10 inner steps; at most 640 fit"),
    (dict(inner_steps=10, tokens=-5), "claims -5 tokens"),
])
def test_claims_outside_what_the_run_allows_are_refused(work, message):
    me = Identity.generate()
    with pytest.raises(EnvelopeError, match=message) as err:
        open_update(sign_update(me, header(me, **work)), **EXPECT)
    assert err.value.reason == "bad-work"


@pytest.mark.parametrize("value", [True, 1.5, "12", None])
def test_work_fields_that_are_not_integers_are_malformed(value):
    me = Identity.generate()
    from protocol.envelope import UPDATE_TAG
    body = {**header_body(header(me, inner_steps=3, tokens=3)), "inner_steps": value}
    with pytest.raises(EnvelopeError, match="'inner_steps' missing or not int") as err:
        open_update(sign_body(me, UPDATE_TAG, body), **EXPECT)
    assert err.value.reason == "malformed"


def test_a_v3_header_without_work_is_refused_with_what_to_do():
    me = Identity.generate()
    fields = {k: v for k, v in header_body(header(me)).items() if k not in ("inner_steps", "tokens")}
    with pytest.raises(EnvelopeError, match="old format 'swarmloco/update-header/v3'.*upgrade swarmloco"):
        open_update(sign_body(me, "swarmloco/update-header/v3", fields), **EXPECT)


def test_the_run_bounds_claims_by_its_window_or_its_fixed_h():
    fixed, window = RunConfig(), window_config(max_steps=200)
    for cfg, most in ((fixed, fixed.inner.steps), (window, 200)):
        math = RoundMath(cfg, 1000)
        me = Identity.generate()
        tokens_per_step = cfg.data.batch_size * cfg.model.seq_len

        def signed(steps: int):
            h = build_update_header(run_id=cfg.run_id, round_=0, peer_id=me.peer_id, codec=cfg.compression.codec, numel=1000,
                                    layout_hash="L", base_param_hash="B", payload=PAYLOAD, inner_steps=steps,
                                    tokens=steps * tokens_per_step, slices=["00" * 32] * math.layout.num_slices)
            return sign_update(me, h)

        size = min(cfg.max_payload_bytes, math.codec.max_encoded_size(1000))
        assert size >= len(PAYLOAD)
        assert math.open_update(signed(most), round_=0, layout_hash="L").inner_steps == most
        with pytest.raises(EnvelopeError, match=f"allows 0 to {most}"):
            math.open_update(signed(most + 1), round_=0, layout_hash="L")


# --- config ------------------------------------------------------------------------------------


def test_window_config_is_checked_and_a_rule_that_cannot_weigh_is_refused_at_start():
    with pytest.raises(ConfigError, match="rounds.window_s=-1"):
        window_config(window_s=-1.0)
    with pytest.raises(ConfigError, match="min_steps"):
        window_config(min_steps=5, max_steps=4)
    assert window_config(overlap_communication=True).rounds.overlap_communication  # the swarm-aligned window
    data = window_config().to_dict()
    data["exchange"]["mode"] = "all-to-all"
    with pytest.raises(ConfigError, match="exchange.mode = 'all-to-all' does not pass the claims to its rule yet"):
        RoundMath(RunConfig.from_dict(data), 1000)
    data["exchange"]["mode"], data["aggregation"]["name"] = "sliced", "dnc"
    with pytest.raises(ConfigError, match="aggregation dnc does not take weights: use one of mean, median"):
        RoundMath(RunConfig.from_dict(data), 1000)
    data["aggregation"]["name"], data["aggregation"]["options"] = "trimmed-mean", {"bucket_size": 2}
    with pytest.raises(ConfigError, match="trimmed-mean with nnm or bucketing does not take weights"):
        RoundMath(RunConfig.from_dict(data), 1000)
    RoundMath(RunConfig.from_dict({**data, "rounds": {**data["rounds"], "window_s": 0.0}}), 1000)  # fixed H: any rule


# --- weights from claims -----------------------------------------------------------------------


def test_rows_are_weighed_by_their_capped_claims_only_in_a_window_run():
    work = RowWork.of([100, 100, 50, 25], {}, ["a", "b", "c", "d"])
    assert row_weights(RunConfig(), work, 0) is None  # fixed H: unweighted
    assert row_weights(window_config(), work, 0) == [100.0, 100.0, 50.0, 25.0]
    # an inflated claim is capped at 2x the round's median claim (100 here)
    assert row_weights(window_config(), RowWork.of([100, 100, 50, 2500], {}, "abcd"), 0) == [100.0, 100.0, 50.0, 200.0]
    # and at 2x what the manifest says was accepted for its author last round
    history = {"d": 30}
    assert row_weights(window_config(), RowWork.of([100, 100, 50, 100], history, "abcd"), 0) == [100.0, 100.0, 50.0, 60.0]
    assert row_weights(window_config(), RowWork.of([0, 0], {}, "ab"), 0) is None  # nobody carries work: equal


def test_a_window_slice_reduces_by_work_and_equal_claims_give_the_unweighted_bytes():
    cfg = window_config()
    math = RoundMath(cfg, 4000)
    rows = torch.randn(4, math.layout.size(0), generator=torch.Generator().manual_seed(1))
    plain = RoundMath(RunConfig(), 4000).reduce_slice(rows, 0, round_=2)
    equal = math.reduce_slice(rows, 0, round_=2, work=RowWork.of([640] * 4, {}, "abcd"))
    assert equal == plain  # equal work: the unweighted rule, bit for bit
    mixed = RowWork.of([640, 640, 320, 160], {}, "abcd")
    first = math.reduce_slice(rows, 0, round_=2, work=mixed)
    assert first != plain
    # the owners agree: the same rows and claims in another order give the same bytes
    order = [2, 0, 3, 1]
    assert math.reduce_slice(rows[order], 0, round_=2, work=mixed.subset(order)) == first
    # the weighted median (the default rule) by hand, coordinate 0: mass 640, 640, 320, 160, each row
    # seen per unit of its claim at the round's typical work tau = the weighted median claim, 640
    claims = [640, 640, 320, 160]
    tau = 640
    values = [v * tau / c for v, c in zip(rows[:, 0].tolist(), claims)]
    ranked = sorted(zip(values, claims))
    mass, half = 0.0, 880.0
    for value, weight in ranked:
        if mass + weight > half:
            break
        mass += weight
    assert math.decode_result(first, 0)[0].item() == pytest.approx(value, abs=1e-3)  # fp16 result format


def test_rows_that_differ_only_by_their_work_meet_on_one_scale_for_the_median_but_not_the_mean():
    # Four rows of one direction g, each scaled by the steps behind it (640, 640, 320, 160 tokens):
    # the median sees them per unit of work, all equal, and returns g at tau = 640 tokens (the
    # weighted median claim). The mean weighs the raw rows: sum(c * c g) / sum(c) = 538.2 g.
    claims = [640, 640, 320, 160]
    tau = 640
    g = torch.linspace(-1, 1, RoundMath(window_config(), 4000).layout.size(0)) / 1000
    rows = torch.stack([g * c for c in claims])
    work = RowWork.of(claims, {}, "abcd")
    median = RoundMath(window_config(), 4000)
    combined = median.decode_result(median.reduce_slice(rows, 0, round_=1, work=work), 0)
    assert torch.allclose(combined, g * tau, rtol=2e-3, atol=1e-6)  # fp16 result format
    data = window_config().to_dict()
    data["aggregation"]["name"] = "mean"
    mean = RoundMath(RunConfig.from_dict(data), 4000)
    combined = mean.decode_result(mean.reduce_slice(rows, 0, round_=1, work=work), 0)
    assert torch.allclose(combined, g * sum(c * c for c in claims) / sum(claims), rtol=2e-3, atol=1e-6)
    skewed = rows.clone()
    skewed[3] = -skewed[3] * 50  # one row off: the mean moves with it, the median stays on g * tau
    assert not torch.allclose(mean.decode_result(mean.reduce_slice(skewed, 0, round_=1, work=work), 0), g * 538.2, rtol=0.1)
    assert torch.allclose(median.decode_result(median.reduce_slice(skewed, 0, round_=1, work=work), 0), g * tau,
                          rtol=2e-3, atol=1e-6)


def test_the_manifest_signs_the_work_history_and_a_fixed_h_manifest_stays_without_it():
    coordinator, peer = Identity.generate(), Identity.generate()
    keys = CoordinatorKeys.of_key(coordinator.public_key)
    signed = sign_update(peer, header(peer, inner_steps=3, tokens=96))
    entry = ManifestEntry(peer_id=peer.peer_id, payload_sha256=header(peer).payload_sha256, payload_size=len(PAYLOAD),
                          header=signed_to_json(signed), holders=["127.0.0.1:1"])
    plain = RoundManifest(run_id="run", round=3, base_param_hash="B", entries=[entry], excluded={})
    assert b"work_history" not in sign_manifest(coordinator, plain).body
    with_history = dataclasses.replace(plain, work_history={peer.peer_id: 96})
    opened = open_manifest(sign_manifest(coordinator, with_history), keys=keys, run_id="run", round_=3)
    assert opened.work_history == {peer.peer_id: 96}
    bad = sign_body(coordinator, "swarmloco/round-manifest/v3",
                    {**_manifest_body(sign_manifest(coordinator, plain)), "work_history": {peer.peer_id: -1}})
    with pytest.raises(EnvelopeError, match="lacks required fields"):
        open_manifest(bad, keys=keys, run_id="run", round_=3)


def _manifest_body(signed) -> dict:
    import json
    return json.loads(signed.body.split(b"\n", 1)[1])


def test_the_ledger_caps_shows_and_remembers_each_peers_work():
    math = RoundMath(window_config(), 4000)
    ledger = WorkLedger(math)
    ids = [Identity.generate() for _ in range(4)]
    claims = [(20, 640), (20, 640), (10, 320), (80, 2560)]  # the last claims 4x a fast peer's work
    headers = {p.peer_id: (s, t) for p, (s, t) in zip(ids, claims)}
    assert ledger.history(list(headers)) == {}  # nothing accepted yet
    first = ledger.close(headers, {}, 0)
    liar = first[ids[3].peer_id]
    assert (liar["inner_steps"], liar["tokens"], liar["capped_by"]) == (80, 2560, "median")
    assert liar["weight"] == pytest.approx(1280 / (640 + 640 + 320 + 1280))  # capped at 2x the median claim (640)
    assert first[ids[2].peer_id]["weight"] == pytest.approx(320 / 2880) and first[ids[2].peer_id]["capped_by"] == ""
    # the next manifest signs what was accepted; an author's jump is capped by it
    history = ledger.history(list(headers))
    assert history == {ids[0].peer_id: 640, ids[1].peer_id: 640, ids[2].peer_id: 320, ids[3].peer_id: 1280}
    jumped = {**headers, ids[2].peer_id: (40, 1280)}
    second = ledger.close(jumped, history, 0)
    assert second[ids[2].peer_id]["capped_by"] == "history" and ledger.accepted[ids[2].peer_id] == 640
    # a fixed-H run: every update counts the same, the claims are shown
    fixed = WorkLedger(RoundMath(RunConfig(), 4000)).close(headers, {}, 0)
    assert {v["weight"] for v in fixed.values()} == {0.25} and fixed[ids[3].peer_id]["inner_steps"] == 80


# --- the window ----------------------------------------------------------------------------------


class Steps:
    step = 0


def test_the_window_stops_once_closed_and_after_the_minimum_steps():
    trainer = Steps()
    closed = window_stop(trainer, closes=float("-inf"), min_steps=3)  # closed already
    open_ = window_stop(trainer, closes=float("inf"), min_steps=1)  # never closes
    seen = []
    for _ in range(5):
        trainer.step += 1
        seen.append((closed(), open_()))
    assert seen == [(False, False), (False, False), (True, False), (True, False), (True, False)]
    assert window_stop(trainer, closes=float("inf"), min_steps=1, also=lambda: True)()  # the overlap's stop still counts
    # An overlapped phase's second call counts the minimum from the phase's first step, not its own.
    assert window_stop(trainer, closes=float("-inf"), min_steps=3, first=trainer.step - 3)()
    assert not window_stop(trainer, closes=float("-inf"), min_steps=3, first=trainer.step - 2)()
