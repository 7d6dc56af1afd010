"""protocol/merkle.py: every leaf of every tree size proves, and nothing else does."""

import hashlib

import pytest

from protocol import merkle


def digests(n: int, salt: bytes = b"") -> list[bytes]:
    return [hashlib.sha256(salt + i.to_bytes(4, "big")).digest() for i in range(n)]


@pytest.mark.parametrize("n", range(1, 41))
def test_every_leaf_of_every_size_verifies_and_nothing_else(n):
    leaves = digests(n)
    top = merkle.root(leaves)
    all_proofs = merkle.proofs(leaves)
    assert len(all_proofs) == n
    for i, leaf in enumerate(leaves):
        path = all_proofs[i]
        assert path == merkle.proof(leaves, i)
        assert len(path) <= (n - 1).bit_length()  # at most ceil(log2 n) siblings
        assert merkle.verify(leaf, i, n, path, top)
        # another leaf's digest at this index, this leaf at another index, another count: refused
        if n > 1:
            assert not merkle.verify(leaves[(i + 1) % n], i, n, path, top)
        if n > 1:
            assert not merkle.verify(leaf, (i + 1) % n, n, path, top)
        assert not merkle.verify(leaf, i, n + 1, path, top)
        if n > 1:
            assert not merkle.verify(leaf, i, n - 1, path, top)


def test_one_leaf_tree_is_the_leaf_hash_and_needs_no_proof():
    (leaf,) = digests(1)
    top = hashlib.sha256(b"\x00" + leaf).digest()
    assert merkle.root([leaf]) == hashlib.sha256(b"\x02" + (1).to_bytes(8, "big") + top).digest()
    assert merkle.proof([leaf], 0) == []
    assert merkle.verify(leaf, 0, 1, [], merkle.root([leaf]))
    assert not merkle.verify(hashlib.sha256(b"other").digest(), 0, 1, [], merkle.root([leaf]))


def test_three_leaves_by_hand():
    """The odd leaf goes up unpaired: root = node(node(L0, L1), L2)."""
    a, b, c = digests(3)
    leaf = merkle.leaf_hash
    top = merkle.node_hash(merkle.node_hash(leaf(a), leaf(b)), leaf(c))
    expected = hashlib.sha256(b"\x02" + (3).to_bytes(8, "big") + top).digest()
    assert merkle.root([a, b, c]) == expected
    assert merkle.proof([a, b, c], 2) == [merkle.node_hash(leaf(a), leaf(b))]
    assert merkle.proof([a, b, c], 0) == [leaf(b), leaf(c)]


def test_tampered_proofs_are_refused():
    leaves = digests(28)
    top = merkle.root(leaves)
    path = merkle.proof(leaves, 13)
    assert merkle.verify(leaves[13], 13, 28, path, top)
    for k in range(len(path)):
        flipped = list(path)
        flipped[k] = bytes([flipped[k][0] ^ 1]) + flipped[k][1:]
        assert not merkle.verify(leaves[13], 13, 28, flipped, top)
    assert not merkle.verify(leaves[13], 13, 28, path[:-1], top)  # a sibling short
    assert not merkle.verify(leaves[13], 13, 28, path + [path[0]], top)  # one too many
    assert not merkle.verify(leaves[13], 13, 28, list(reversed(path)), top)
    assert not merkle.verify(leaves[13], 13, 28, [h[:31] for h in path], top)  # truncated hashes
    assert not merkle.verify(leaves[13], 13, 28, path, merkle.root(digests(28, b"x")))  # another tree's root
    assert not merkle.verify(leaves[13], -1, 28, path, top)
    assert not merkle.verify(leaves[13], 28, 28, path, top)
    assert not merkle.verify(leaves[13], 13, 0, path, top)


def test_domain_separation_an_inner_node_is_not_a_leaf():
    """The two children of the root, offered as a 2-leaf tree's leaves, do not give its root."""
    leaves = digests(4)
    levels_up = [merkle.node_hash(merkle.leaf_hash(leaves[0]), merkle.leaf_hash(leaves[1])),
                 merkle.node_hash(merkle.leaf_hash(leaves[2]), merkle.leaf_hash(leaves[3]))]
    assert merkle.root(levels_up) != merkle.root(leaves)
    # and no duplication trick: [a, b, c] and [a, b, c, c] have different roots
    a, b, c = digests(3)
    assert merkle.root([a, b, c]) != merkle.root([a, b, c, c])


def test_bad_leaf_lists_are_refused_with_a_reason():
    with pytest.raises(merkle.MerkleError, match="1..65536 leaves"):
        merkle.root([])
    with pytest.raises(merkle.MerkleError, match="32-byte digest"):
        merkle.root([b"short"])
    with pytest.raises(merkle.MerkleError, match="leaf 3 outside 0..2"):
        merkle.proof(digests(3), 3)


@pytest.mark.parametrize("n", [2, 3, 5, 7, 8, 11, 28, 33])
def test_a_proof_that_stops_at_a_node_proven_before_verifies_and_nothing_false_does(n):
    leaves = digests(n)
    top = merkle.root(leaves)
    full = merkle.proofs(leaves)
    saved = 0
    for a in range(n):
        known = merkle.verify_against(leaves[a], a, n, full[a], top, {})
        assert known is not None
        for b in range(n):
            if b == a:
                continue
            level = merkle.known_level(b, n, known)
            short = merkle.truncate(full[b], b, n, level)
            saved += len(full[b]) - len(short)
            proven = merkle.verify_against(leaves[b], b, n, short, top, known)
            assert proven is not None and proven[(0, b)] == merkle.leaf_hash(leaves[b])
            assert merkle.verify_against(leaves[b], b, n, full[b], top, known) is not None  # longer than needed: fine
            assert merkle.verify_against(leaves[a], b, n, short, top, known) is None  # another leaf
            if short:
                bad = [bytes(32)] + short[1:]
                assert merkle.verify_against(leaves[b], b, n, bad, top, known) is None
            if len(short) < len(full[b]):  # without what was proven before, the short proof is not enough
                assert merkle.verify_against(leaves[b], b, n, short, top, {}) is None
                assert not merkle.verify(leaves[b], b, n, short, top)
    assert saved > 0 or n == 2  # two leaves: each needs its one sibling whatever is known


def test_known_nodes_of_another_tree_do_not_prove_anything():
    """A cache is per root: nodes proven under one tree make no short proof of another hold."""
    leaves, other = digests(16), digests(16, b"o")
    known_other = merkle.verify_against(other[0], 0, 16, merkle.proof(other, 0), merkle.root(other), {})
    short = merkle.truncate(merkle.proof(leaves, 1), 1, 16, merkle.known_level(1, 16, known_other))
    assert len(short) == 1
    assert merkle.verify_against(leaves[1], 1, 16, short, merkle.root(leaves), known_other) is None
