"""Row screening for sparse rows: an update no other update vouches for is set aside.

Used by `sparse-trimmed-mean` (optim/sparse_robust.py, option `screen`). On top-k rows a
coordinate-wise rule sees 1-3 senders per coordinate, too few to outvote f colluding attackers
there (docs/robust-compressed.md). But honest pseudo-gradients of one round agree with each other
in sign wherever their supports meet, and they meet often: in the Byzantine bench's recipe runs
(8 peers, top-64 of 4096) two honest rows share 2-37 coordinates of a chunk, and sign
disagreements among honest rows were 0-11 in a whole run. Attacks made for sparse rows either
put their mass where no honest peer sends (index poisoning, slow accumulation: no shared
coordinate) or oppose the honest peers where they send (sign flip, IPM, vote-tailored: shared
coordinates of the opposite sign). Either way no honest row vouches for them, only their f - 1
accomplices.

    net[i, k] = sum_j sign(x_ij) * sign(x_kj)    # shared coordinates agreeing minus disagreeing (exact integers)
    support_i = #{k != i : net[i, k] >= min_net}
    a row with support_i < f has no honest voucher (at most f - 1 other rows are Byzantine)

The screen sets aside the rows with support < f, but only when there are at most f of them: more
means the evidence itself is thin (small slices, few rows), and then no row is set aside. The rule
then runs on the rest with f reduced by the rows set aside (each is counted as one of the f).
f = 0 screens nothing. Deterministic and order-independent: integer counts (float64 products of
-1, 0, +1, exact), a per-row test. Memory: one (n, n) matrix plus a column block of signs.

What it does not stop: an attacker that copies enough honest values to be vouched for keeps the
rest of its row (within the value clip) and meets the rule's vote and sign agreement as before.
"""

from __future__ import annotations

import torch

COLUMN_BLOCK = 1 << 16
DEFAULT_MIN_NET = 1  # a voucher shares at least one more agreeing coordinate than disagreeing ones


def agreement(rows: torch.Tensor) -> torch.Tensor:
    """(n, d) -> (n, n) float64: net sign agreement of every pair of rows (an exact integer per pair)."""
    n, d = rows.shape
    net = torch.zeros(n, n, dtype=torch.float64)
    for start in range(0, d, COLUMN_BLOCK):
        signs = torch.sign(rows[:, start : start + COLUMN_BLOCK]).double()  # (n, c) in {-1, 0, 1}
        net.add_(signs @ signs.T)  # sums of integers well below 2**53: exact in any order
    return net


def support(rows: torch.Tensor, min_net: int = DEFAULT_MIN_NET) -> torch.Tensor:
    """(n, d) -> (n,) int64: how many other rows vouch for each row (net agreement >= min_net)."""
    net = agreement(rows)
    net.fill_diagonal_(-torch.inf)
    return (net >= min_net).sum(dim=1)


def screen(rows: torch.Tensor, f: int, min_net: int = DEFAULT_MIN_NET) -> torch.Tensor:
    """(n, d) -> (n,) bool, the rows kept: all but those with fewer than f vouchers, when at most
    f rows fall short (more: every row kept); every row when f = 0."""
    n = rows.shape[0]
    if f <= 0 or n < 2:
        return torch.ones(n, dtype=torch.bool)
    short = support(rows, min_net) < f
    if int(short.sum()) > f:
        return torch.ones(n, dtype=torch.bool)
    return ~short
