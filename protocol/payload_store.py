"""What a node holds and serves: verified update payloads, slices (by the Merkle root their author
signed, with their proofs) and blobs (aggregated slices) by sha256, for the last few rounds; the waits
for slices pushed to it; and its aggregated slices on their way over the trade streams
(protocol/result_relay.py). The `Peer` service (protocol/payload_service.py) serves from it.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass

from protocol._generated import swarm_pb2
from protocol.envelope import UpdateHeader, check_payload
from protocol.result_relay import ResultRelay

MAX_ENDED_PUSHES = 4096  # trades' ended pushes a store remembers (PayloadStore.push_ended)


@dataclass(frozen=True, slots=True)
class StoredPayload:
    header: UpdateHeader
    signed_header: swarm_pb2.Signed
    payload: bytes


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """A verified piece addressed by its sha256 alone: one slice of an update, or an aggregated
    slice (the sliced exchange). Its round only decides when it is dropped."""

    round: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class StoredSlice:
    """Slice `index` of an update, addressed by the Merkle root its author signed: the bytes, their
    sha256 (the leaf) and the proof that puts that leaf under the root, so it is served verifiable."""

    round: int
    digest: str  # sha256 hex of `payload`
    proof: tuple[bytes, ...]  # the whole proof, bottom first
    count: int  # leaves of the tree (the update's num_slices): fixes which levels the siblings are on
    payload: bytes


class PayloadStore:
    """sha256 -> verified payload or blob, (slices_root, index) -> verified slice, for the last few
    rounds (older ones are dropped)."""

    def __init__(self, keep_rounds: int = 2) -> None:
        self.keep_rounds = keep_rounds
        self._lock = threading.Lock()
        self._slice_added = threading.Condition(self._lock)  # wait_slices: pushed slices arriving
        self._items: dict[str, StoredPayload] = {}
        self._blobs: dict[str, StoredBlob] = {}
        self._slices: dict[tuple[bytes, int], StoredSlice] = {}
        self._pushes_ended: dict[bytes, int] = {}  # slices_root -> round: a push of that update's slices to us ended
        self._newest = -1  # the newest round stored: older than newest - keep_rounds is dropped
        # our aggregated slices on their way to their gatherers over the trade streams, and theirs to us
        self.results = ResultRelay(keep_rounds)

    def put_slice(self, slices_root: bytes, index: int, item: StoredSlice) -> None:
        """Store a slice the caller has verified against `slices_root` (its proof checked, or the
        tree built here from the payload)."""
        with self._lock:
            self._slices[(slices_root, index)] = item
            self._drop_old(item.round)
            self._slice_added.notify_all()

    def push_ended(self, slices_root: bytes, round_: int) -> None:
        """A trade's push of the slices under `slices_root` to us ended (what it brought that
        proved is stored): whoever waits for more of them (wait_slices(..., until_push_ended=True))
        stops waiting and fetches what is missing from their author, who serves them. Remembered
        for the newest MAX_ENDED_PUSHES roots at most (a caller's header is only signed, not
        checked against any manifest: these marks must not grow, nor move the store's rounds)."""
        with self._lock:
            self._pushes_ended.pop(slices_root, None)
            self._pushes_ended[slices_root] = round_
            while len(self._pushes_ended) > MAX_ENDED_PUSHES:
                del self._pushes_ended[next(iter(self._pushes_ended))]
            self._slice_added.notify_all()

    def wait_slices(self, wanted: list[tuple[bytes, int]], timeout_s: float, *, until_push_ended: bool = False) -> None:
        """Block until every (slices_root, index) in `wanted` is stored or `timeout_s` passes
        (slices pushed to us, which we own: by a client-mode author, or in a trade another owner
        opened). `until_push_ended`: also stop for a key whose root's push ended without it (a
        trade's: its author serves it, so fetching it is the fallback; a client-mode author's
        push is waited for whole, since nobody else serves its slices and anyone may replay its
        signed header in a push of its own)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while not all(key in self._slices or (until_push_ended and key[0] in self._pushes_ended) for key in wanted):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._slice_added.wait(left)

    def get_slice(self, slices_root: bytes, index: int) -> StoredSlice | None:
        with self._lock:
            return self._slices.get((slices_root, index))

    def put_blob(self, sha256: str, round_: int, data: bytes) -> None:
        """Store bytes the caller has verified against `sha256` (a fetch checks it on receipt)."""
        with self._lock:
            self._blobs[sha256] = StoredBlob(round_, data)
            self._drop_old(round_)

    def take_result(self, round_: int, partner: str, j: int, data: bytes) -> None:
        """An aggregated slice a trade partner sent us (protocol/result_relay.py): stored under its
        own sha256, believed by nobody until the gather finds that sha256 signed by the owners.
        Kept only while the plan says `partner` owes it (once), and never over a blob we hold."""
        if not self.results.is_due(round_, partner, j):
            return
        sha = hashlib.sha256(data).hexdigest()
        if self.lookup(sha) is None:
            self.put_blob(sha, round_, data)
        self.results.received(round_, partner, j)

    def put(self, item: StoredPayload, *, verified: bool = False) -> None:
        """Store a payload. `verified=True` when the caller has just checked size and sha256
        against the signed header (hashing a 40 MB payload twice more is not free)."""
        if not verified:
            check_payload(item.header, item.payload)
        with self._lock:
            self._items[item.header.payload_sha256] = item
            self._drop_old(item.header.round)

    def _drop_old(self, round_: int) -> None:
        """Under the lock, after storing something of `round_`: sweep only when the newest round
        advances (a round stores hundreds of slices; a sweep per put would be quadratic)."""
        if round_ <= self._newest:
            if round_ < self._newest - self.keep_rounds:  # already too old to keep
                self._items = {s: i for s, i in self._items.items() if i.header.round != round_}
                self._blobs = {s: b for s, b in self._blobs.items() if b.round != round_}
                self._slices = {k: v for k, v in self._slices.items() if v.round != round_}
                self._pushes_ended = {k: r for k, r in self._pushes_ended.items() if r != round_}
            return
        self._newest = round_
        cutoff = round_ - self.keep_rounds
        self._items = {s: i for s, i in self._items.items() if i.header.round >= cutoff}
        self._blobs = {s: b for s, b in self._blobs.items() if b.round >= cutoff}
        self._slices = {k: v for k, v in self._slices.items() if v.round >= cutoff}
        self._pushes_ended = {k: r for k, r in self._pushes_ended.items() if r >= cutoff}

    def lookup(self, sha256: str) -> StoredBlob | None:
        """What we serve under `sha256`: a whole payload or a blob, with its round."""
        with self._lock:
            item = self._items.get(sha256)
            if item is not None:
                return StoredBlob(item.header.round, item.payload)
            return self._blobs.get(sha256)

    def get_blob(self, sha256: str) -> bytes | None:
        found = self.lookup(sha256)
        return None if found is None else found.payload

    def get(self, sha256: str) -> StoredPayload | None:
        with self._lock:
            return self._items.get(sha256)

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)
