"""Model FLOPs utilization: training FLOPs per token and the device's peak, for the progress line.

FLOPs per token of a training step: 6 N (forward + backward through every weight) plus the
attention scores, 12 n_layer d_model T (PaLM's appendix B). Peak: dense bf16 tensor-core figures
from the vendors' data sheets for the GPUs named here; None elsewhere (a CPU has no meaningful
single figure), and then no MFU is shown.
"""

from __future__ import annotations

import torch

# Dense bf16 peak FLOP/s by a substring of torch.cuda.get_device_name() (first match wins).
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H200", 989e12), ("H100", 989e12), ("GH200", 989e12), ("A100", 312e12), ("A10G", 125e12), ("A10", 125e12),
    ("L40S", 362e12), ("L40", 181e12), ("L4", 121e12), ("4090", 165e12), ("3090", 71e12), ("V100", 125e12), ("T4", 65e12),
)


def flops_per_token(num_params: int, n_layer: int, d_model: int, seq_len: int) -> float:
    return 6.0 * num_params + 12.0 * n_layer * d_model * seq_len


def peak_flops(device: torch.device | str) -> float | None:
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    return next((peak for key, peak in PEAK_BF16_FLOPS if key in name), None)


def mfu(tokens_per_s: float, per_token: float, peak: float | None) -> float | None:
    return None if peak is None else tokens_per_s * per_token / peak
