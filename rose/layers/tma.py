"""Tensor descriptors (Hopper's TMA, the copy engine) for ROSE's Triton kernels (rose.layers.gate_up_act,
rose.attention.triton_varlen): the host-side class where this Triton has it, the GPUs that
have TMA (and those whose shared memory holds the GEMMs' tiles), TMA's rules for a tensor one descriptor may cover,
weights' descriptors made once, and the GEMMs' grouped tile order."""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU builds of torch ship without Triton
    triton = None
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


@functools.cache
def gemm_tiles_fit(device: int) -> bool:
    """Hopper or datacenter Blackwell: TMA (has_tma), and ~227 KB of shared memory a block for the GEMMs' tiles
    (consumer Blackwell, sm_120, has ~99 KB)."""
    return has_tma(device) and torch.cuda.get_device_capability(device)[0] <= 10


def device_index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_WEIGHT_DESCRIPTORS: dict[tuple, object] = {}  # a weight's descriptor by (address, shape, dtype, block)


def weight_descriptor(weight: torch.Tensor, block: list[int]):
    """The weight's tensor descriptor, made once per address, shape and block (a descriptor holds only those: one
    cached for a freed tensor is right for the next tensor of that shape at that address)."""
    key = (weight.data_ptr(), tuple(weight.shape), weight.dtype, *block)
    desc = _WEIGHT_DESCRIPTORS.get(key)
    if desc is None:
        if len(_WEIGHT_DESCRIPTORS) >= 1024:
            _WEIGHT_DESCRIPTORS.clear()
        desc = _WEIGHT_DESCRIPTORS[key] = TensorDescriptor.from_tensor(weight, block)
    return desc


if triton is not None:
    DTYPES = {torch.bfloat16: tl.bfloat16, torch.float16: tl.float16, torch.float32: tl.float32}

    @triton.jit
    def grouped_tile(tile, M, INNER: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
        """(row block, column block) of a GEMM's tile: GROUP_M row blocks together, column block by column block,
        so that neighbouring programs share weight tiles in L2."""
        blocks_m = tl.cdiv(M, BM)
        in_group = GROUP_M * (INNER // BN)
        first_m = (tile // in_group) * GROUP_M
        rows_here = tl.minimum(blocks_m - first_m, GROUP_M)
        return first_m + (tile % in_group) % rows_here, (tile % in_group) // rows_here
else:  # pragma: no cover - no Triton: the kernels that use these are never defined
    DTYPES, grouped_tile = {}, None
