"""A binary Merkle tree over 32-byte leaf digests: one root commits to every slice of an update.

An update header signs `slices_root` and `num_slices` instead of one sha256 per slice, so a
manifest that carries n headers costs O(n) bytes whatever S is. A slice then travels with its
*proof*: the sibling hashes on the path from its leaf to the root, bottom first.

Hashing is domain-separated so that a leaf can never pass for an inner node (or the reverse):

    leaf(d)     = sha256(0x00 || d)          d = sha256(slice bytes), the slice's content address
    node(l, r)  = sha256(0x01 || l || r)
    root        = sha256(0x02 || count as 8 bytes, big-endian || the top node)

A level with an odd number of nodes promotes its last node to the next level unchanged (it is not
paired with a copy of itself: duplication lets two different leaf lists share a root). The leaf
count is hashed into the root (the header signs it too), and verify() walks the tree's shape from
it, so a proof checked under another count, another index, or for another leaf fails.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence

DIGEST_BYTES = 32
LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
ROOT_PREFIX = b"\x02"
MAX_LEAVES = 1 << 16  # far above exchange.slices' bound (4096): a proof is at most 16 hashes


class MerkleError(ValueError):
    """A proof or a leaf list that cannot be right (wrong sizes, index out of range)."""


def leaf_hash(digest: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + digest).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(NODE_PREFIX + left + right).digest()


def _sealed(top: bytes, count: int) -> bytes:
    """The root: the top node bound to the leaf count (two trees whose paths look alike for one
    leaf, say 3 and 4 leaves, still have different roots)."""
    return hashlib.sha256(ROOT_PREFIX + count.to_bytes(8, "big") + top).digest()


def _check_leaves(digests: Sequence[bytes]) -> None:
    if not 1 <= len(digests) <= MAX_LEAVES:
        raise MerkleError(f"a Merkle tree holds 1..{MAX_LEAVES} leaves, not {len(digests)}")
    if any(len(d) != DIGEST_BYTES for d in digests):
        raise MerkleError(f"every leaf is a {DIGEST_BYTES}-byte digest")


def _levels(digests: Sequence[bytes]) -> list[list[bytes]]:
    """Every level of the tree, leaves first, the root's level (one node) last."""
    _check_leaves(digests)
    level = [leaf_hash(d) for d in digests]
    levels = [level]
    while len(level) > 1:
        paired = [node_hash(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            paired.append(level[-1])  # the odd one out goes up as it is
        level = paired
        levels.append(level)
    return levels


def root(digests: Sequence[bytes]) -> bytes:
    """The root over these leaf digests, in order."""
    return _sealed(_levels(digests)[-1][0], len(digests))


def proofs(digests: Sequence[bytes]) -> list[list[bytes]]:
    """Every leaf's proof (sibling hashes, bottom first), built from one pass over the tree."""
    levels = _levels(digests)
    out: list[list[bytes]] = []
    for index in range(len(digests)):
        path: list[bytes] = []
        i = index
        for level in levels[:-1]:
            sibling = i ^ 1
            if sibling < len(level):  # a promoted node has no sibling at this level
                path.append(level[sibling])
            i //= 2
        out.append(path)
    return out


def proof(digests: Sequence[bytes], index: int) -> list[bytes]:
    """The proof of leaf `index`."""
    if not 0 <= index < len(digests):
        raise MerkleError(f"leaf {index} outside 0..{len(digests) - 1}")
    return proofs(digests)[index]


def verify(digest: bytes, index: int, count: int, path: Sequence[bytes], expected_root: bytes) -> bool:
    """Whether `digest` is leaf `index` of a `count`-leaf tree with this root. Never raises on
    hostile input: a proof of the wrong length, a hash of the wrong size, an index outside the
    tree are all just False."""
    return verify_against(digest, index, count, path, expected_root, {}) is not None


Known = dict[tuple[int, int], bytes]  # (level, position) -> a node already proven under one root


def verify_against(digest: bytes, index: int, count: int, path: Sequence[bytes], expected_root: bytes,
                   known: Known) -> Known | None:
    """verify() where `path` may stop short at a node already proven (`known`, from this root's
    earlier proofs): the walk up ends there instead of at the root. -> the nodes this proof
    authenticates (for `known`), or None when it does not hold."""
    if not (1 <= count <= MAX_LEAVES and 0 <= index < count and len(digest) == DIGEST_BYTES):
        return None
    if len(expected_root) != DIGEST_BYTES or any(len(h) != DIGEST_BYTES for h in path):
        return None
    node, i, width, used, level = leaf_hash(digest), index, count, 0, 0
    seen: Known = {(0, index): node}
    while width > 1:
        if level and (level, i) in known:  # proven before: must agree, and the proof may stop here
            if known[(level, i)] != node:
                return None
            if used == len(path):
                return seen
        sibling = i ^ 1
        if sibling < width:
            if used == len(path):
                return None
            seen[(level, sibling)] = path[used]
            node = node_hash(node, path[used]) if i % 2 == 0 else node_hash(path[used], node)
            used += 1
        i, width, level = i // 2, (width + 1) // 2, level + 1
        seen[(level, i)] = node
    return seen if used == len(path) and _sealed(node, count) == expected_root else None


def known_level(index: int, count: int, known: Known) -> int:
    """The lowest level above the leaves at which leaf `index`'s path meets a proven node (0: none,
    the whole proof is needed). A holder asked for proof_levels = L sends only the siblings below L."""
    i, width, level = index, count, 0
    while width > 1:
        i, width, level = i // 2, (width + 1) // 2, level + 1
        if (level, i) in known:
            return level
    return 0


def truncate(path: Sequence[bytes], index: int, count: int, levels: int) -> list[bytes]:
    """The siblings of `path` (leaf `index`'s whole proof) on the levels below `levels` (0: all)."""
    if levels <= 0:
        return list(path)
    i, width, level, keep = index, count, 0, 0
    while width > 1 and level < levels:
        keep += (i ^ 1) < width
        i, width, level = i // 2, (width + 1) // 2, level + 1
    return list(path[:keep])


class ProvenNodes:
    """What the proofs of one root's slices have proven so far, shared by the fetches of those
    slices (thread-safe): each later fetch asks only for the siblings below the first proven node
    on its path, so an owner fetching k slices of one update pays about one whole proof, not k."""

    def __init__(self, root: bytes, count: int) -> None:
        self.root, self.count = root, count
        self._known: Known = {}
        self._lock = threading.Lock()

    def levels_for(self, index: int) -> int:
        with self._lock:
            return known_level(index, self.count, self._known)

    def plan(self, indices: Sequence[int]) -> list[int]:
        """levels_for each of these leaves fetched in this order in one stream, each counting on
        what the earlier ones will prove once they arrive (a batched fetch asks for all at once)."""
        with self._lock:
            positions: set[tuple[int, int]] = set(self._known)
        out = []
        for index in indices:
            out.append(known_level(index, self.count, positions))  # type: ignore[arg-type]  # only `in` is used
            i, width, level = index, self.count, 0
            positions.add((0, index))
            while width > 1:  # the proof proves its siblings and every node on the path up
                if (i ^ 1) < width:
                    positions.add((level, i ^ 1))
                i, width, level = i // 2, (width + 1) // 2, level + 1
                positions.add((level, i))
        return out

    def accept(self, digest: bytes, index: int, path: Sequence[bytes]) -> bool:
        """Whether `path` proves `digest` as leaf `index` (whole, or down from a proven node); what
        it proves is kept."""
        with self._lock:
            proven = verify_against(digest, index, self.count, path, self.root, self._known)
            if proven is None:
                return False
            self._known.update(proven)
            return True

    def proof_of(self, index: int) -> list[bytes] | None:
        """Leaf `index`'s whole proof from the proven nodes (to serve a slice fetched with a short
        one), or None when some sibling on its path is not proven."""
        with self._lock:
            path: list[bytes] = []
            i, width, level = index, self.count, 0
            while width > 1:
                if (i ^ 1) < width:
                    sibling = self._known.get((level, i ^ 1))
                    if sibling is None:
                        return None
                    path.append(sibling)
                i, width, level = i // 2, (width + 1) // 2, level + 1
            return path
