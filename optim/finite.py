"""Finiteness checks over decoded values: an owner's rows of a slice, a gathered aggregate, an
aggregator's input. One place, numpy's isfinite mask on the CPU (cheaper than torch's reductions
at every size measured here), so every check that refuses NaN or Inf costs the same.
"""

from __future__ import annotations

import numpy as np
import torch


def all_finite(values: torch.Tensor) -> bool:
    """No NaN or Inf in `values`: finite_rows over them as one row."""
    return finite_rows(values.reshape(1, -1))[0]


def finite_rows(rows: torch.Tensor) -> list[bool]:
    """(n, s) -> per row: no NaN or Inf in it. On the CPU numpy's isfinite mask: 4x cheaper than two
    torch reductions on a 31K-value slice (per-call overhead), ~1.6x on 10M values, and ~10x
    cheaper than a float64 row sum on an (8, 31K) slice; elsewhere max and min per row, which
    propagate NaN and reach ±Inf, one pass each."""
    if rows.device.type == "cpu" and rows.dtype in _NUMPY_FLOATS:
        values = rows.detach().numpy()
        if values.size <= MASK_ELEMENTS:
            return np.isfinite(values).all(axis=1).tolist()
        return [bool(np.isfinite(row).all()) for row in values]  # a mask per row: (d,) bools at a time, not (n, d)
    return (torch.isfinite(rows.amax(dim=1)) & torch.isfinite(rows.amin(dim=1))).tolist()


_NUMPY_FLOATS = (torch.float32, torch.float64, torch.float16)
MASK_ELEMENTS = 1 << 20  # above this many values, finite_rows masks one row at a time (all-to-all's (n, d) rows)
