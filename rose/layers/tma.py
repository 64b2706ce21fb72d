"""Tensor descriptors (Hopper's TMA, the copy engine) for ROSE's Triton kernels (rose.layers.gate_up_act,
rose.attention.triton_varlen): the host-side class where this Triton has it, the GPUs that have TMA, and TMA's rules
for a tensor one descriptor may cover."""

from __future__ import annotations

import torch

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - no Triton, or one before host-side tensor descriptors: pointer loads only
    TensorDescriptor = None


def describable(t: torch.Tensor) -> bool:
    """Whether a descriptor can cover the 2-D tensor `t`: this Triton has them, its last dimension is contiguous,
    and its base and row stride are whole 16 bytes."""
    return (TensorDescriptor is not None and t.dim() == 2 and t.stride(-1) == 1 and not t.data_ptr() % 16
            and not (t.stride(0) * t.element_size()) % 16)


def has_tma(device: torch.device | int) -> bool:
    """Whether the GPU has TMA, the copy engine descriptors load through: CUDA (ROCm reports its own architectures as
    capabilities, MI300's as 9.4) at compute capability 9 (Hopper) or newer."""
    return torch.version.hip is None and torch.cuda.get_device_capability(device)[0] >= 9
