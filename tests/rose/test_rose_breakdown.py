"""benchmarks/rose_breakdown.py's bookkeeping on any machine: kernel categories and the weight-read floor."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from benchmarks.rose_breakdown import category


@pytest.mark.parametrize("name, want", [
    ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, "
     "cutlass::bfloat16_t, Flash_kernel_traits<128, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false, "
     "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)", "attention"),
    ("void flashinfer::BatchPrefillWithRaggedKVCacheKernel<flashinfer::KernelTraits<cutlass::bfloat16_t, 128>>"
     "(flashinfer::RaggedParams)", "attention"),
    ("kernel_cutlass_kernel_flash_attncuteflash_fwd_sm90FlashAttentionForwardSm90_object_at__tensor0", "attention"),
    ("nvjet_tst_128x64_64x8_2x1_v_bz_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel"
     "__5x_cublas", "gemm"),
    ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>(Params)", "gemm"),
    ("_gate_up_silu_tma_kernel", "gemm"),  # ROSE's fused gate-up: SiLU·mul rides in its epilogue
    ("_act_mul_kernel", "activation"),  # SiLU·mul apart (below 2048 tokens)
    ("_attention_kernel", "attention"),  # ROSE's Triton ragged attention
    ("_add_rms_norm_kernel", "norm"),

    ("Memcpy HtoD (Pinned -> Device)", "copy"),
])
def test_kernel_categories(name, want):
    assert category(name) == want


def test_the_weight_floor_leaves_out_the_embedding_tables():
    from benchmarks.rose_breakdown import weight_bytes

    model = torch.nn.ModuleDict({"embed_tokens": torch.nn.Embedding(1000, 16), "position": torch.nn.Embedding(64, 16),
                                 "proj": torch.nn.Linear(16, 32, bias=False)}).to(torch.bfloat16)
    engine = SimpleNamespace(_runner=SimpleNamespace(model=model))
    assert weight_bytes(engine) == (16 * 32 * 2, (1000 + 64) * 16 * 2)
