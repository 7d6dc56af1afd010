"""Every RPC of a live coordinator, bombarded with random and mutated messages (seeded generator).

The server must answer each with a status, never an unhandled exception; correct requests from
a real identity must keep succeeding between batches; its memory must stay bounded. What is
thrown at it is counted and printed (`pytest -s`) for the closing report. Exhausting its
resources (long-poll slots, a stalled push, floods, Sybil joins): tests/test_rpc_limits.py.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from peer.coordinator.service import HEARTBEAT_TAG, JOIN_TAG
from protocol.wire import swarm_pb2
from protocol.envelope import UPDATE_TAG, check_payload, open_manifest, signed_from_json
from protocol.identity import Identity
from protocol.run_state import CoordinatorKeys
from protocol.payload_service import push_chunks
from protocol.signing import sign_body
from tests.helpers import tiny_run_config
from tests.coordinator_harness import heartbeat, join, join_body, make_update, serve_coordinator

COORDINATOR = "/swarmloco.v1.Coordinator/"
PEER = "/swarmloco.v1.Peer/"
UNARY = {  # method -> request type
    COORDINATOR + "GetRunInfo": swarm_pb2.RunInfoRequest,
    COORDINATOR + "Join": swarm_pb2.Signed,
    COORDINATOR + "Heartbeat": swarm_pb2.Signed,
    COORDINATOR + "SubmitCommitment": swarm_pb2.CommitRequest,
    COORDINATOR + "GetManifest": swarm_pb2.ManifestRequest,
    COORDINATOR + "Status": swarm_pb2.StatusRequest,
}
SERVER_STREAMING = {COORDINATOR + "StreamCheckpoint": swarm_pb2.CheckpointRequest, PEER + "FetchPayload": swarm_pb2.FetchRequest}
CLIENT_STREAMING = {PEER + "PushPayload": swarm_pb2.PushChunk}
BATCHES = 6
# The coordinator's own payload checks (fetch, decode, exclude) run in the all-to-all exchange;
# the sliced exchange's RPCs have their own hostile-input test below.
ALL_TO_ALL = {"mode": "all-to-all"}
PER_BATCH = 40  # iterations per batch; each sends ~11 hostile calls: ~2,650 in all


def rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS in /proc/self/status")


class Fuzzer:
    """Seeded generator of hostile requests; raw bytes go through identity serializers."""

    def __init__(self, served, rng: random.Random) -> None:
        self.served = served
        self.rng = rng
        self.channel = served.channel
        self.sent: Counter[str] = Counter()  # kind -> calls
        self.codes: Counter[str] = Counter()  # status code name -> calls
        self.identities = [Identity.generate() for _ in range(4)]

    # --- building blocks ----------------------------------------------------------------

    def random_bytes(self, max_len: int = 512) -> bytes:
        return self.rng.randbytes(self.rng.randrange(max_len))

    def mutate(self, data: bytes) -> bytes:
        data = bytearray(data)
        for _ in range(self.rng.randrange(1, 6)):
            op = self.rng.randrange(5)
            i = self.rng.randrange(len(data) + 1)
            if op == 0 and data:
                data[min(i, len(data) - 1)] ^= 1 << self.rng.randrange(8)  # bit flip
            elif op == 1:
                data[i:i] = self.random_bytes(16)  # insert
            elif op == 2:
                del data[i : i + self.rng.randrange(1, 32)]  # delete
            elif op == 3:
                data[i:i] = data[: self.rng.randrange(len(data) + 1)]  # duplicate a prefix
            else:
                data = data[:i]  # truncate
        return bytes(data)

    def hostile_json(self) -> object:
        """Values that break naive parsers: huge ints, deep nesting, NaN, wrong types, long strings."""
        choice = self.rng.randrange(10)
        return [
            lambda: 10 ** self.rng.randrange(10, 4200),
            lambda: -(2**63) - self.rng.randrange(1000),
            lambda: float("nan"),
            lambda: float("inf"),
            lambda: "x" * self.rng.randrange(100_000),
            lambda: [[[[[[[[]]]]]]]],
            lambda: {"a": {"b": [None, True, 1.5]}},
            lambda: None,
            lambda: True,
            lambda: "",
        ][choice]()

    def signed_json(self, tag: str, fields: dict, identity: Identity | None = None) -> swarm_pb2.Signed:
        identity = identity or self.rng.choice(self.identities)
        text = json.dumps(fields)
        bomb = self.rng.random()
        if bomb < 0.07:
            text = "[" * self.rng.randrange(1000, 200_000)  # recursion bomb, validly signed
        elif bomb < 0.14:  # an integer past Python's 4300-digit str->int limit, in every field
            text = json.dumps({k: 0 for k in fields}).replace(": 0", ": 1" + "0" * self.rng.randrange(4300, 20_000))
        body = tag.encode() + b"\n" + text.encode()
        return swarm_pb2.Signed(body=body, signature=identity.sign(body), public_key=identity.public_key)

    def hostile_fields(self, base: dict) -> dict:
        fields = dict(base)
        for key in self.rng.sample(sorted(fields), self.rng.randrange(1, len(fields) + 1)):
            fields[key] = self.hostile_json()
        if self.rng.random() < 0.3:
            fields["extra" * self.rng.randrange(1, 5)] = self.hostile_json()
        return fields

    def mutated_signed(self, good: swarm_pb2.Signed) -> swarm_pb2.Signed:
        part = self.rng.randrange(4)
        body, sig, key = good.body, good.signature, good.public_key
        if part == 0:
            body = self.mutate(body)
        elif part == 1:
            sig = self.mutate(sig)
        elif part == 2:
            key = self.mutate(key)
        else:
            other = self.rng.choice(self.identities)
            sig, key = other.sign(body), (key if self.rng.random() < 0.5 else other.public_key)
        return swarm_pb2.Signed(body=body, signature=sig, public_key=key)

    # --- calls ----------------------------------------------------------------------------

    def call_unary(self, method: str, payload: bytes, kind: str, timeout: float = 5.0) -> None:
        self.sent[kind] += 1
        metadata = [("x-swarmloco-peer", self.rng.choice(["fuzzer", self.random_bytes(40).hex(), ""]))]
        call = self.channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            call(payload, timeout=timeout, metadata=metadata)
            self.codes["OK"] += 1
        except grpc.RpcError as exc:
            self.codes[exc.code().name] += 1

    def call_stream(self, method: str, payload: bytes, kind: str, *, read: int = 3) -> None:
        self.sent[kind] += 1
        call = self.channel.unary_stream(method, request_serializer=None, response_deserializer=None)
        try:
            for i, _ in enumerate(call(payload, timeout=5)):
                if i >= read:
                    break  # walk away mid-stream
            self.codes["OK"] += 1
        except grpc.RpcError as exc:
            self.codes[exc.code().name] += 1

    def call_push(self, messages: list[swarm_pb2.PushChunk], kind: str) -> None:
        self.sent[kind] += 1
        call = self.served.peer_stub.PushPayload
        try:
            call(iter(messages), timeout=5)
            self.codes["OK"] += 1
        except grpc.RpcError as exc:
            self.codes[exc.code().name] += 1

    # --- one batch over every RPC --------------------------------------------------------------

    def batch(self, n: int) -> None:
        c = self.served.coordinator
        rng = self.rng
        all_methods = list(UNARY) + list(SERVER_STREAMING) + list(CLIENT_STREAMING)
        for _ in range(n):
            # 1. Random bytes as the raw request of a random method.
            method = rng.choice(list(UNARY) + list(SERVER_STREAMING))
            raw = self.random_bytes(rng.choice([8, 64, 4096]))
            (self.call_stream if method in SERVER_STREAMING else self.call_unary)(method, raw, "random-bytes")

            # 2. Mutated valid messages (serialized protobufs with flipped/inserted/deleted bytes).
            good = self.valid_messages()
            method = rng.choice(sorted(good))
            mutated = self.mutate(good[method].SerializeToString())
            (self.call_stream if method in SERVER_STREAMING else self.call_unary)(method, mutated, "mutated-protobuf")

            # 3. Signed bodies: mutated envelopes, and validly signed bodies with hostile fields.
            identity = rng.choice(self.identities)
            signed_join = sign_body(identity, JOIN_TAG, join_body(self.served))
            self.call_unary(COORDINATOR + "Join", self.mutated_signed(signed_join).SerializeToString(), "mutated-signed")
            hostile = self.signed_json(JOIN_TAG, self.hostile_fields(join_body(self.served, endpoint="127.0.0.1:1")), identity)
            self.call_unary(COORDINATOR + "Join", hostile.SerializeToString(), "hostile-fields")
            beat = self.signed_json(HEARTBEAT_TAG, self.hostile_fields(
                {"peer_id": identity.peer_id, "round": c.round, "param_hash": c.param_hash, "state": "x", "step": 1,
                 "loss": 1.0, "bytes_sent": 1, "bytes_received": 1, "round_bytes": {"round": 1}, "utilization": 0.5,
                 "timestamp": time.time()}), identity)
            self.call_unary(COORDINATOR + "Heartbeat", beat.SerializeToString(), "hostile-fields")
            signed_update, payload, header = make_update(self.served, identity, seed=rng.randrange(1 << 30))
            fields = {f: getattr(header, f) for f in header.__slots__}
            hostile_update = self.signed_json(UPDATE_TAG, self.hostile_fields(fields), identity)
            for signed in (hostile_update, self.mutated_signed(signed_update)):
                request = swarm_pb2.CommitRequest(header=signed, endpoint=rng.choice(["", "127.0.0.1:1", "x" * 300, "h:99999"]))
                self.call_unary(COORDINATOR + "SubmitCommitment", request.SerializeToString(), "hostile-update")

            # 4. Numeric edge cases: negative / huge offsets, NaN and infinite waits, bogus sha256.
            offset = rng.choice([-1, -(2**63), 2**63 - 1, 10**9, 0])
            self.call_stream(COORDINATOR + "StreamCheckpoint", swarm_pb2.CheckpointRequest(offset=offset).SerializeToString(), "edge-numbers")
            fetch = swarm_pb2.FetchRequest(sha256=rng.choice(["", "00" * 32, "z" * 10_000, header.payload_sha256]), offset=offset)
            self.call_stream(PEER + "FetchPayload", fetch.SerializeToString(), "edge-numbers")
            wait = rng.choice([float("nan"), float("inf"), -float("inf"), -5.0, 1e308, 0.01])
            manifest = swarm_pb2.ManifestRequest(round=rng.choice([-1, 0, 2**62, c.round]), wait_s=wait)
            # A short client deadline: the server caps its long-poll to it (a long wait is tested below).
            self.call_unary(COORDINATOR + "GetManifest", manifest.SerializeToString(), "edge-numbers", timeout=0.6)

            # 5. Pushes that lie: declared size vs bytes sent, streams past the declared size,
            #    no header, garbage header, huge declared size.
            lie = rng.randrange(5)
            if lie == 0:  # more bytes than declared
                msgs = list(push_chunks(signed_update, payload + self.random_bytes(64) + b"!"))
            elif lie == 1:  # fewer bytes than declared
                msgs = list(push_chunks(signed_update, payload[: rng.randrange(len(payload))]))
            elif lie == 2:  # right size, wrong bytes
                msgs = list(push_chunks(signed_update, self.mutate(payload)[: len(payload)].ljust(len(payload), b"\0")))
            elif lie == 3:  # no header at all / random header
                msgs = [swarm_pb2.PushChunk(data=self.random_bytes(256))]
                if rng.random() < 0.5:
                    msgs[0].header.CopyFrom(self.mutated_signed(signed_update))
            else:  # a validly signed header that declares a huge payload
                big = {**fields, "payload_size": rng.choice([2**40, -1, 0, 2**63 - 1])}
                msgs = [swarm_pb2.PushChunk(header=self.signed_json(UPDATE_TAG, big, identity), data=b"\0" * 1024)]
            self.call_push(msgs, "lying-push")

        # 6. Oversized messages: past the gRPC message limit (refused by the transport).
        for method in rng.sample(all_methods[:6], 2):
            self.call_unary(method, b"\x0a" + b"\xff" * 5 + b"\x7f" + b"A" * (2 << 20), "huge-message")

    def valid_messages(self) -> dict[str, object]:
        identity = self.rng.choice(self.identities)
        signed, payload, _ = make_update(self.served, identity, seed=self.rng.randrange(1 << 30))
        return {
            COORDINATOR + "GetRunInfo": swarm_pb2.RunInfoRequest(),
            COORDINATOR + "Join": sign_body(identity, JOIN_TAG, join_body(self.served)),
            COORDINATOR + "Heartbeat": sign_body(identity, HEARTBEAT_TAG, {"peer_id": identity.peer_id, "timestamp": time.time()}),
            COORDINATOR + "SubmitCommitment": swarm_pb2.CommitRequest(header=signed, endpoint=""),
            COORDINATOR + "GetManifest": swarm_pb2.ManifestRequest(round=0, wait_s=0.01),
            COORDINATOR + "Status": swarm_pb2.StatusRequest(),
            COORDINATOR + "StreamCheckpoint": swarm_pb2.CheckpointRequest(offset=5),
            PEER + "FetchPayload": swarm_pb2.FetchRequest(sha256="ab" * 32),
        }


def assert_manifest_holds_only_verified_updates(c, round_: int, honest: Identity) -> None:
    """Whatever the fuzz did, the signed manifest lists only updates whose signed header verifies
    for this round and whose payload is held, with the right hash; the honest one among them."""
    manifest = open_manifest(c.manifests[round_], keys=CoordinatorKeys.of_key(c.identity.public_key), run_id=c.cfg.run_id, round_=round_)
    assert honest.peer_id in [e.peer_id for e in manifest.entries]
    for entry in manifest.entries:
        header = c.verify_header(signed_from_json(entry.header), round_)
        assert header.peer_id == entry.peer_id and header.payload_sha256 == entry.payload_sha256
        check_payload(header, c.store.get(entry.payload_sha256).payload)


def check_correct_requests(served, honest: Identity, round_seed: int) -> None:
    """What an honest peer does, all of which must still work."""
    info = served.stub.GetRunInfo(swarm_pb2.RunInfoRequest(), timeout=10)
    assert info.run_id == served.coordinator.cfg.run_id and info.param_hash == served.coordinator.param_hash
    assert join(served, honest).accepted
    reply = heartbeat(served, honest)
    assert not reply.banned
    signed, payload, _ = make_update(served, honest, seed=round_seed)
    # Commit this batch's update (a new round each batch, so it is never an equivocation).
    assert served.peer_stub.PushPayload(push_chunks(signed, payload), timeout=10).accepted
    commit = served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed), timeout=10)
    assert commit.accepted, commit.reason
    assert json.loads(served.stub.Status(swarm_pb2.StatusRequest(), timeout=10).json)["round"] == served.coordinator.round


def test_every_rpc_survives_thousands_of_hostile_messages(capsys):
    cfg = tiny_run_config(rounds={"rounds": BATCHES + 2}, exchange=ALL_TO_ALL)
    # Generous rate limits so the hostile requests reach the handlers (rate limiting is tested below).
    with serve_coordinator(cfg, generous_limits=True, max_stream_s=3.0) as served:
        c = served.coordinator
        honest = Identity.generate()
        fuzzer = Fuzzer(served, random.Random(20240917))
        check_correct_requests(served, honest, 0)
        rss_start = rss_kib()
        for batch in range(BATCHES):
            fuzzer.batch(PER_BATCH)
            # Close the round so the next batch's honest commitment is for a new round.
            with c.lock:
                result = c.close_round("test")
            assert_manifest_holds_only_verified_updates(c, result.round, honest)
            check_correct_requests(served, honest, batch + 1)
        rss_growth_mib = (rss_kib() - rss_start) / 1024

        counts = served.rejections()
        total = sum(fuzzer.sent.values())
        with capsys.disabled():
            print(f"\nfuzz: {total} hostile calls {dict(fuzzer.sent)}\n  status codes {dict(fuzzer.codes)}"
                  f"\n  rejections {dict(counts)}\n  RSS growth {rss_growth_mib:.1f} MiB")
        assert total > 2500
        assert counts.get("internal-error", 0) == 0
        assert rss_growth_mib < 200
        assert not c.registry.is_banned(honest.peer_id)
        assert len(c.registry.peers) <= c.registry.max_peers


def test_sliced_round_rpcs_survive_hostile_messages():
    """SubmitSliceResult, GetSliceResults and ReportEvidence under garbage, forgeries, malformed
    batches and edge numbers while a sliced round is reducing: every call answered with a typed
    refusal or a gRPC status, no handler error, and the owner's valid batch still lands (once)
    and closes the round; a second, different batch is equivocation."""
    from protocol.slice_result import SLICE_RESULTS_TAG, SliceResult, sign_mismatch_report, sign_slice_results

    with serve_coordinator(tiny_run_config(), generous_limits=True) as served:
        c = served.coordinator
        owner, stranger = Identity.generate(), Identity.generate()
        assert join(served, owner, "127.0.0.1:9").accepted and join(served, stranger).accepted
        signed, _, header = make_update(served, owner)
        commit = served.stub.SubmitCommitment(swarm_pb2.CommitRequest(header=signed, endpoint="127.0.0.1:9"), timeout=10)
        assert commit.accepted, commit.reason
        with c.lock:
            assert c.close_round("test") is None and c.book.closed  # the manifest is out; owners reduce
        r, slices = c.book.round, c.math.layout.num_slices
        assert slices >= 2  # the owner (the only server) owns every slice
        manifest_sha = hashlib.sha256(c.manifests[r].body).hexdigest()

        def result(**fields) -> SliceResult:
            base = dict(run_id=c.cfg.run_id, round=r, slice=0, owner=owner.peer_id, manifest_sha256=manifest_sha,
                        result_sha256="ab" * 32, result_size=8, inputs=(owner.peer_id,), excluded={})
            return SliceResult(**{**base, **fields})

        def batch(identity: Identity = owner, **fields) -> swarm_pb2.Signed:
            """`identity`'s batch over every slice, `fields` changed in slice 0's result."""
            return sign_slice_results(identity, [result(**fields)] + [result(slice=j, owner=fields.get("owner", owner.peer_id),
                                                                             round=fields.get("round", r),
                                                                             manifest_sha256=fields.get("manifest_sha256", manifest_sha))
                                                                      for j in range(1, slices)])

        signed_ok = batch()

        def resigned(body: bytes) -> swarm_pb2.Signed:
            return swarm_pb2.Signed(body=body, signature=owner.sign(body), public_key=owner.public_key)

        rng = random.Random(7)
        tag = SLICE_RESULTS_TAG.encode() + b"\n"
        hostile_results = [
            swarm_pb2.Signed(body=rng.randbytes(200), signature=rng.randbytes(64), public_key=rng.randbytes(32)),
            batch(stranger, owner=stranger.peer_id),  # not an owner
            # (a batch names no slice: its rows are the signer's slices of the manifest, in order)
            batch(round=r + 7),
            batch(manifest_sha256="cd" * 32),  # another manifest
            batch(result_size=1 << 40),
            batch(result_size=0),
            batch(excluded={"e" * 32: "unreachable"}),  # a peer the manifest does not list
            sign_slice_results(owner, [result()]),  # leaves out slices it owns
            resigned(signed_ok.body[:-5]),  # truncated
            resigned(signed_ok.body + b"\x00"),  # a byte after the last field
            resigned(tag + rng.randbytes(300)),  # garbage after the tag
            resigned(tag + b"\xff" * 12),  # a varint longer than 10 bytes
            swarm_pb2.Signed(body=b"\x01\xff\xff\x7f", signature=owner.sign(b"x")),  # packed, no such owner index
            swarm_pb2.Signed(body=b"\x01\x00" + b"\x00" * slices, signature=owner.sign(b"x")),  # packed copies of nothing
            sign_body(owner, "swarmloco/slice-results/v3", {"run_id": c.cfg.run_id, "round": r}),  # the old JSON batch
            sign_body(owner, "swarmloco/slice-results/v2", {"run_id": c.cfg.run_id, "round": r}),  # the old hex batch
            sign_body(owner, "swarmloco/slice-result/v1", {"run_id": c.cfg.run_id, "round": r}),  # the old per-slice tag
            resigned(signed_ok.body + bytes(100_000)),  # oversized
            swarm_pb2.Signed(body=signed_ok.body, signature=bytes(64), public_key=signed_ok.public_key),  # forged
        ]
        for hostile in hostile_results:
            reply = served.stub.SubmitSliceResult(hostile, timeout=10)
            assert not reply.accepted and reply.refusal != swarm_pb2.REFUSAL_UNSPECIFIED, (hostile_results.index(hostile), reply)
        assert not sliced_batches(c, r)
        for request in (swarm_pb2.SliceResultsRequest(round=-1, wait_s=float("nan")),
                        swarm_pb2.SliceResultsRequest(round=(1 << 63) - 1, wait_s=float("inf")),
                        swarm_pb2.SliceResultsRequest(round=r, wait_s=-5.0, until_applied=True)):
            reply = served.stub.GetSliceResults(request, timeout=10)
            assert not reply.ready and not reply.applied
        reports = [
            swarm_pb2.Signed(body=rng.randbytes(100), signature=rng.randbytes(64), public_key=rng.randbytes(32)),
            sign_body(owner, "swarmloco/slice-mismatch/v1", {"run_id": c.cfg.run_id, "round": r, "slice": 0, "results": []}),
            sign_body(owner, "swarmloco/slice-mismatch/v1", {"run_id": c.cfg.run_id, "round": r, "slice": 0, "results": ["%%%"]}),
        ]
        for hostile in reports:
            with pytest.raises(grpc.RpcError) as err:
                served.stub.ReportEvidence(hostile, timeout=10)
            assert err.value.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAUTHENTICATED)
        unknown = served.stub.ReportEvidence(sign_mismatch_report(Identity.generate(), run_id=c.cfg.run_id, round_=r, slice_=0,
                                                                  results=[signed_ok]), timeout=10)
        assert not unknown.accepted and unknown.refusal == swarm_pb2.UNKNOWN_PEER
        out_of_range = served.stub.ReportEvidence(sign_mismatch_report(stranger, run_id=c.cfg.run_id, round_=r, slice_=slices,
                                                                       results=[signed_ok]), timeout=10)
        assert not out_of_range.accepted
        assert served.rejections().get("internal-error", 0) == 0
        # The honest owner's batch lands, once; the round can close on it.
        assert served.stub.SubmitSliceResult(signed_ok, timeout=10).accepted
        assert served.stub.SubmitSliceResult(signed_ok, timeout=10).reason == "already submitted"  # idempotent
        with c.lock:
            assert c.exchange.should_finalize(time.monotonic()) == (True, "every owner reported")
        # A second, different batch from the same owner in the same round: equivocation, banned with both.
        second = served.stub.SubmitSliceResult(batch(result_sha256="cd" * 32), timeout=10)
        assert not second.accepted and second.refusal == swarm_pb2.EQUIVOCATION
        assert c.registry.get(owner.peer_id).evidence[-1]["kind"] == "result-equivocation"
        assert served.rejections().get("internal-error", 0) == 0


def sliced_batches(c, r: int) -> dict:
    """The signed batches the coordinator holds for sliced round r."""
    with c.lock:
        return dict(c.exchange.rounds[r].batches)
