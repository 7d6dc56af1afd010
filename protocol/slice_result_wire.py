"""Slice-result batches as they travel: packed, without what their receiver already holds.

Every peer reads every owner's signed batch every round (protocol/slice_result.py), so what a
batch repeats is paid n times per peer per round. Packed, a batch leaves out:

  - the fields every batch of the round shares (tag, run_id, round, manifest sha256): the
    receiver knows them from the manifest it holds;
  - the owner's public key (32 bytes): the batch names the owner by its index in the manifest's
    entries, whose signed headers carry the key;
  - in a list of batches (GetSliceResults), a result row equal to the row an earlier batch of the
    list gave for the same slice (the slice's other owner agreeing: the common case): one byte.

    packed:  0x01  owner index (varint)  row count (varint)
             per row: result_size (varint) + sha256 (32 raw), or 0 = "as the last row of this slice"
             the exclusions, as in the full body

A receiver rebuilds the full signed body (`BatchUnpacker.full`) and checks the signature over it,
so packing changes no byte of what is signed and verified: a packer that rebuilds wrongly (a
dishonest coordinator copying a row the owner did not sign) produces a batch whose signature
fails, which the receiver drops, as it would a batch withheld. The full form is what a node keeps
as evidence; a full batch passes through `full` unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from protocol._generated import swarm_pb2
from protocol.binary_fields import BinaryFieldError, Reader, put_varint
from protocol.envelope import EnvelopeError
from protocol.identity import peer_id_of
from protocol.reasons import Reason
from protocol.slice_result import TAG_PREFIX, batch_context, owned_slices

PACKED = 0x01  # a full body starts with its tag ("swarmloco/..."), never with this byte
SAME_ROW = 0  # a row's size is never 0 (open_slice_results refuses it): 0 marks a copied row

Row = tuple[int, bytes]  # (result_size, sha256 raw)


def pack_batches(batches: Sequence[swarm_pb2.Signed], *, peer_ids: Sequence[str],
                 owners: Sequence[Sequence[str]]) -> list[swarm_pb2.Signed]:
    """Full, verified batches of one round (in the order they will travel) -> their packed forms."""
    last: dict[int, Row] = {}  # slice -> the last row sent for it in this list
    packed = []
    for signed in batches:
        owner = peer_id_of(signed.public_key)
        reader = Reader(signed.body)
        if not signed.body.startswith(TAG_PREFIX):
            raise ValueError("only full slice-result batches are packed")
        reader.pos = len(TAG_PREFIX)
        reader.sized("run_id", limit=len(signed.body))
        reader.varint("round")
        reader.raw(32, "manifest_sha256")
        out = bytearray([PACKED])
        put_varint(out, list(peer_ids).index(owner))
        owned = owned_slices(owners, owner)
        count = reader.varint("results count")
        if count != len(owned):
            raise ValueError(f"a batch of {count} rows from an owner of {len(owned)} slices")
        put_varint(out, count)
        for j in owned:
            row = (reader.varint("result_size"), reader.raw(32, "result_sha256"))
            if last.get(j) == row:
                put_varint(out, SAME_ROW)
            else:
                put_varint(out, row[0])
                out += row[1]
            last[j] = row
        out += reader.rest()
        packed.append(swarm_pb2.Signed(body=bytes(out), signature=signed.signature))
    return packed


class BatchUnpacker:
    """Rebuilds the full batches of one round from a list of packed ones, in the list's order."""

    def __init__(self, *, run_id: str, round_: int, manifest_sha256: str, peer_ids: Sequence[str],
                 owners: Sequence[Sequence[str]], public_keys: Mapping[str, bytes]) -> None:
        self.context = batch_context(run_id, round_, manifest_sha256)
        self.peer_ids = list(peer_ids)
        self.owners = owners
        self.public_keys = public_keys
        self.last: dict[int, Row] = {}

    def full(self, signed: swarm_pb2.Signed) -> swarm_pb2.Signed:
        """The full signed batch (EnvelopeError "malformed" when `signed` is neither form)."""
        if not signed.body.startswith(bytes([PACKED])):
            return signed  # a full batch (or another kind of body, which opening refuses)
        try:
            return self._rebuild(signed)
        except BinaryFieldError as exc:
            raise EnvelopeError(Reason.MALFORMED, f"packed slice results refused: {exc}") from None

    def _rebuild(self, signed: swarm_pb2.Signed) -> swarm_pb2.Signed:
        reader = Reader(signed.body, 1)
        owner = self.peer_ids[reader.varint("owner index", limit=max(0, len(self.peer_ids) - 1))] if self.peer_ids else ""
        key = self.public_keys.get(owner)
        if key is None:
            raise EnvelopeError(Reason.MALFORMED, f"packed slice results name {owner[:8] or 'nobody'}, whose key the manifest lacks")
        owned = owned_slices(self.owners, owner)
        count = reader.varint("results count")
        if count != len(owned):
            raise EnvelopeError(Reason.MALFORMED, f"packed slice results hold {count} rows; the manifest gives "
                                                  f"{owner[:8]} {len(owned)} slices")
        body = bytearray(self.context)
        put_varint(body, count)
        for j in owned:
            size = reader.varint(f"result_size of slice {j}")
            if size == SAME_ROW:
                if j not in self.last:
                    raise EnvelopeError(Reason.MALFORMED, f"packed slice results copy a row of slice {j} no earlier batch gave")
                row = self.last[j]
            else:
                row = (size, reader.raw(32, f"result_sha256 of slice {j}"))
            self.last[j] = row
            put_varint(body, row[0])
            body += row[1]
        body += reader.rest()
        return swarm_pb2.Signed(body=bytes(body), signature=signed.signature, public_key=key)
