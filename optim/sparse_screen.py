"""Row screening for sparse rows: an update that no other update vouches for, that copies another
one, or that carries next to no work is set aside.

Used by `sparse-trimmed-mean` (optim/sparse_robust.py, option `screen`). On top-k rows a
coordinate-wise rule sees 1-3 senders per coordinate, too few to outvote f colluding attackers
there (docs/robust-compressed.md). But honest pseudo-gradients of one round agree with each other
in sign wherever their supports meet, and they meet often: in the Byzantine bench's recipe runs
(8 peers, top-64 of 4096) two honest rows share 2-37 coordinates of a chunk, and sign
disagreements among honest rows were 0-11 in a whole run. Attacks made for sparse rows either
put their mass where no honest peer sends (index poisoning, slow accumulation, label flipping:
no or one shared coordinate by chance) or oppose the honest peers where they send (sign flip,
IPM, vote-tailored: shared coordinates of the opposite sign). Either way no honest row vouches
for them, only their f - 1 accomplices. A row is "short" when any of three tests says so:

    net[i, k] = sum_j sign(x_ij) * sign(x_kj)    # shared coordinates agreeing minus disagreeing (exact integers)
    vouchers_i = #{k != i : net[i, k] >= min_net}
    a) vouchers_i < f: no honest voucher (at most f - 1 other rows are Byzantine)
    b) copy: row i is bit-identical to another row: honest peers train on different data, their
       rows never coincide, so of k equal rows at least k - 1 are Byzantine (mimicry: f attackers
       sending one honest row again; colluders sending one crafted row f times). Which of k equal
       rows is kept does not matter. (Not the sign pattern alone: where a slice is a short chunk
       every row sends whole, honest rows can share it.)
    c) tiny: |x_i| < lower median of the rows' norms / floor: a row of next to no work that
       agrees with everyone in sign (a shrunken honest mean, as min-max and min-sum send on
       these rows) erases the coordinates it votes for, through the rule's smallest-magnitude
       choice among few senders

The screen sets aside the short rows, but only when there are at most f of them: more means the
evidence itself is thin (small slices, few rows), and then no row is set aside. The rule then runs
on the rest with f reduced by the rows set aside (each is counted as one of the f). f = 0 screens
nothing. Deterministic and order-independent: integer counts (float64 products of -1, 0, +1,
exact), norms as sequential float64 sums, copies by bytes. Memory: one (n, n) matrix plus a column block of signs.

What it does not stop: an attacker that copies enough honest values to be vouched for, changes at
least one bit of a row it copies, and keeps at least 1/floor of the median norm,
keeps the rest of its row (within the value clip) and meets the rule's vote and sign agreement as
before.
"""

from __future__ import annotations

import torch

COLUMN_BLOCK = 1 << 16
DEFAULT_MIN_NET = 2  # a voucher shares at least two more agreeing coordinates than disagreeing ones
DEFAULT_FLOOR = 2.0  # a row under 1/2 of the median norm is tiny (the rule's clip_ratio caps rows at 2x)


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


def row_norms(rows: torch.Tensor) -> torch.Tensor:
    """(n,) float64 L2 norms, each a sequential float64 sum of squares (the same bits whatever the
    thread count; float64: Byzantine entries near the float32 limit would overflow a float32 square)."""
    out = torch.empty(rows.shape[0], dtype=torch.float64)
    for i, row in enumerate(rows):
        out[i] = torch.cumsum(row.double().square_(), dim=0)[-1].sqrt() if row.numel() else 0.0
    return out


def copies(rows: torch.Tensor) -> torch.Tensor:
    """(n, d) -> (n,) bool: every row bit-identical to a row of lower index (of k equal rows, k - 1)."""
    first: dict[bytes, int] = {}
    flagged = []
    for i, row in enumerate(rows.numpy().astype("<f4")):
        flagged.append(first.setdefault(row.tobytes(), i) != i)
    return torch.tensor(flagged, dtype=torch.bool)


def tiny(rows: torch.Tensor, floor: float | None = DEFAULT_FLOOR) -> torch.Tensor:
    """(n, d) -> (n,) bool: rows whose norm is below the lower median of the rows' norms / floor
    (None: none). A median of 0 (most rows empty) makes no row tiny."""
    n = rows.shape[0]
    if floor is None or n == 0:
        return torch.zeros(n, dtype=torch.bool)
    norms = row_norms(rows)
    return norms < float(torch.sort(norms).values[(n - 1) // 2]) / floor


def screen(rows: torch.Tensor, f: int, min_net: int = DEFAULT_MIN_NET, floor: float | None = DEFAULT_FLOOR,
           copy_check: bool = True) -> torch.Tensor:
    """(n, d) -> (n,) bool, the rows kept: all but the short ones (fewer than f vouchers, a copy,
    tiny), when at most f rows are short (more: every row kept); every row when f = 0."""
    n = rows.shape[0]
    if f <= 0 or n < 2:
        return torch.ones(n, dtype=torch.bool)
    short = (support(rows, min_net) < f) | tiny(rows, floor)
    if copy_check:
        short |= copies(rows)
    if int(short.sum()) > f:
        return torch.ones(n, dtype=torch.bool)
    return ~short
