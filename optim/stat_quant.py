"""`stat2[:BLOCK]`: 2-bit statistical quantization with a lookup table (SparseLoCo's value format).

Per block of BLOCK values (default 4096) with σ = the block's RMS, each value falls in one of 4
bins of width 3σ spanning ±6σ: (−∞, −3σ), [−3σ, 0), [0, 3σ), [3σ, ∞) (values past ±6σ go to the
outer bins). The sender stores, per block, a float32 lookup table of the 4 bins' means (the value
every member of the bin decodes to; an empty bin stores its centre, ±1.5σ or ±4.5σ), then one
2-bit code per value. So the decoded block keeps the mean of each bin exactly, and a top-k
selection's signed magnitudes survive at 2 bits per value plus 16 bytes per block.

Layout (little-endian): lookup tables (float32, 4 per block, ceil(n/BLOCK) blocks), then codes
(ceil(n/4) bytes, first code in the low bits). Decode refuses a non-finite table entry.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from optim.quantize import BlockedFormat, BlockQuantFormat, CodecError, tensor_from_bytes, tensor_to_bytes

DEFAULT_BLOCK = 4096
BINS = 4
_PACK = BlockQuantFormat(2)  # packs and unpacks 2-bit codes (no scales of its own used here)


@dataclass(frozen=True, slots=True)
class StatFormat(BlockedFormat):
    """stat2[:BLOCK]: see the module docstring."""

    default_block = DEFAULT_BLOCK  # 4096, not the int formats' 64
    block: int = DEFAULT_BLOCK

    def __post_init__(self) -> None:
        self._check_block()

    @property
    def kind(self) -> str:
        return "stat2"

    def size(self, n: int) -> int:
        return 4 * BINS * self.num_blocks(n) + -(-n // 4)

    def quantize(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(n,) float32 -> (codes (n,) uint8 in [0, 4), lookup tables (num_blocks, 4) float32)."""
        n, blocks = x.numel(), self.num_blocks(x.numel())
        block_of = torch.arange(n) // self.block  # (n,)
        count = torch.zeros(blocks).index_add_(0, block_of, torch.ones(n))  # (num_blocks,)
        sigma = torch.zeros(blocks).index_add_(0, block_of, x * x).div_(count.clamp(min=1)).sqrt_()  # RMS
        width = (3 * sigma)[block_of]  # (n,)
        bins = torch.floor(x / torch.where(width > 0, width, torch.ones_like(width))) + 2
        codes = bins.nan_to_num_(2.0).clamp_(0, BINS - 1).to(torch.int64)  # (n,)
        slot = block_of * BINS + codes
        sums = torch.zeros(blocks * BINS).index_add_(0, slot, x)
        members = torch.zeros(blocks * BINS).index_add_(0, slot, torch.ones(n))
        centres = torch.tensor([-4.5, -1.5, 1.5, 4.5]) * sigma[:, None]  # (num_blocks, 4)
        table = torch.where(members > 0, sums / members.clamp(min=1), centres.reshape(-1))
        return codes.to(torch.uint8), table.view(blocks, BINS)

    def encode(self, x: torch.Tensor) -> bytes:
        codes, table = self.quantize(x)
        return tensor_to_bytes(table.contiguous()) + tensor_to_bytes(_PACK._pack(codes))

    def decode(self, payload: memoryview, n: int) -> torch.Tensor:
        if len(payload) != self.size(n):
            raise CodecError(f"{self.name}: expected {self.size(n)} bytes for {n} values, got {len(payload)}")
        table_bytes = 4 * BINS * self.num_blocks(n)
        table = tensor_from_bytes(payload[:table_bytes], torch.float32)  # (num_blocks * 4,)
        if not bool(torch.isfinite(table).all()):
            raise CodecError(f"{self.name}: a lookup-table entry is not finite")
        codes = _PACK._unpack(tensor_from_bytes(payload[table_bytes:], torch.uint8), n).to(torch.int64)  # (n,)
        return table[torch.arange(n) // self.block * BINS + codes]
