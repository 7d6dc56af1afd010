"""Orthonormal DCT-II over chunks of a flat vector (DeMo and the `dct-topk` codec).

A flat (d,) vector is cut into chunks of `chunk` values, the last one zero-padded, giving a
(num_chunks, chunk) matrix; the transform runs over the last dim as one matmul with a cached
(chunk, chunk) basis. The basis is orthonormal, so `idct(dct(x)) == x` up to rounding and the
energy of a chunk equals the energy of its coefficients (which is why keeping the largest
coefficients keeps most of the signal).

WHY float64 inside: every peer decodes the same payloads and must arrive at bit-identical
parameters. A float32 matmul may round differently on CPUs with different SIMD widths; doing the
sum in float64 and rounding once to float32 makes such a difference (almost) never reach the
float32 result.
"""

from __future__ import annotations

import functools
import math

import torch

MAX_CHUNK = 4096  # the basis is chunk**2 float64s: 128 MiB at 4096, and no use case needs more


def _check_chunk(chunk: int) -> None:
    if not isinstance(chunk, int) or not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"DCT chunk size {chunk!r}: use an integer in [1, {MAX_CHUNK}] (64 is the DeMo default)")


@functools.lru_cache(maxsize=8)
def dct_matrix(chunk: int) -> torch.Tensor:
    """Orthonormal DCT-II basis C, float64 (chunk, chunk): X = C @ x, x = C.T @ X.

    C[k, j] = s_k * cos(pi * (2j + 1) * k / (2 * chunk)), s_0 = sqrt(1/chunk), s_k = sqrt(2/chunk).
    Cached and shared: callers must not modify it.
    """
    _check_chunk(chunk)
    k = torch.arange(chunk, dtype=torch.float64)[:, None]  # (chunk, 1) frequency
    j = torch.arange(chunk, dtype=torch.float64)[None, :]  # (1, chunk) position
    basis = torch.cos(math.pi * (2 * j + 1) * k / (2 * chunk))  # (chunk, chunk)
    basis *= math.sqrt(2.0 / chunk)
    basis[0] *= math.sqrt(0.5)
    return basis


def dct(x: torch.Tensor) -> torch.Tensor:
    """DCT-II over the last dim of (num_chunks, chunk); returns the input's dtype."""
    basis = dct_matrix(x.shape[-1])
    return (x.to(torch.float64) @ basis.T).to(x.dtype)  # (num_chunks, chunk)


def idct(coefficients: torch.Tensor) -> torch.Tensor:
    """Inverse of `dct` (DCT-III, orthonormal) over the last dim; returns the input's dtype."""
    basis = dct_matrix(coefficients.shape[-1])
    return (coefficients.to(torch.float64) @ basis).to(coefficients.dtype)  # (num_chunks, chunk)


def num_chunks(numel: int, chunk: int) -> int:
    return -(-numel // chunk)


def to_chunks(x: torch.Tensor, chunk: int) -> torch.Tensor:
    """(d,) -> (ceil(d / chunk), chunk), the tail zero-padded. Always a new tensor."""
    _check_chunk(chunk)
    if x.dim() != 1:
        raise ValueError(f"to_chunks expects a flat (d,) vector, got shape {tuple(x.shape)}")
    padded = x.new_zeros(num_chunks(x.numel(), chunk) * chunk)
    padded[: x.numel()] = x
    return padded.view(-1, chunk)


def from_chunks(chunks: torch.Tensor, numel: int) -> torch.Tensor:
    """(num_chunks, chunk) -> (numel,), dropping the padding that `to_chunks` added."""
    if chunks.dim() != 2 or chunks.numel() < numel:
        raise ValueError(f"from_chunks: cannot take {numel} values out of shape {tuple(chunks.shape)}")
    return chunks.reshape(-1)[:numel]


def top_coefficients(x: torch.Tensor, chunk: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest-magnitude DCT coefficients of every chunk of the flat (d,) vector x.

    Returns (offsets, values), both (num_chunks, k): offsets int64 in increasing order within a
    row (so the encoding is canonical), values the coefficients at those offsets.
    """
    if not 1 <= k <= chunk:
        raise ValueError(f"cannot keep {k} of {chunk} DCT coefficients per chunk: need 1 <= k <= chunk")
    coefficients = dct(to_chunks(x, chunk))  # (num_chunks, chunk)
    offsets = torch.topk(coefficients.abs(), k, dim=1, sorted=False).indices.sort(dim=1).values
    return offsets, coefficients.gather(1, offsets)


def from_coefficients(offsets: torch.Tensor, values: torch.Tensor, chunk: int, numel: int) -> torch.Tensor:
    """Inverse of top_coefficients: scatter (num_chunks, k) values at offsets, inverse DCT -> (numel,)."""
    coefficients = torch.zeros(offsets.shape[0], chunk, dtype=values.dtype)
    coefficients.scatter_(1, offsets, values)
    return from_chunks(idct(coefficients), numel)
