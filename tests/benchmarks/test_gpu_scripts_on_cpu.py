"""The device scripts' own logic, checked here so that lent GPU time is not spent finding their bugs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from benchmarks.rose_breakdown import category
from benchmarks.rose_gpu import VARIANTS, best_profile


def test_kernel_names_fall_into_their_classes() -> None:
    names = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off": "gemm",
        "nvjet_tst_128x64_64x8_2x1_v_bz_coopA_NTN": "gemm",
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>": "attention",
        "BatchPrefillWithRaggedKVCacheKernel": "attention",
        "_add_rms_kernel": "norm",  # rose/layers/fused.py's names
        "_qk_norm_rope_kernel": "norm",  # the fused QK-norm + rotary counts as a norm
        "_silu_mul_kernel": "activation",
        "Memcpy HtoD (Pinned -> Device)": "copy",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "other",
    }
    assert {n: category(n) for n in names} == names


def test_best_profile_prefers_the_causal_measurement(tmp_path: Path) -> None:
    for folder in ("qwen3-0.6b", "qwen3-0.6b-causal", "minilm-l6"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rose_profile.json").write_text("{}")
    assert best_profile(tmp_path, "qwen3-0.6b", causal=True).parent.name == "qwen3-0.6b-causal"
    assert best_profile(tmp_path, "qwen3-0.6b", causal=False).parent.name == "qwen3-0.6b"
    assert best_profile(tmp_path, "minilm-l6", causal=True).parent.name == "minilm-l6"  # none causal: the other
    with pytest.raises(SystemExit):
        best_profile(tmp_path, "qwen3-4b", causal=True)
    assert "rose-best" in VARIANTS and "hf-compile" in VARIANTS


@pytest.mark.slow
def test_breakdown_runs_end_to_end_on_cpu(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import rose_breakdown

    monkeypatch.setattr(sys, "argv", ["rose_breakdown", "--device", "cpu", "--models", "minilm-l6", "--tokens",
                                      "16,64", "--iters", "2", "--out", str(tmp_path), "--root", str(tmp_path / "m")])
    rose_breakdown.main()
    rows = json.loads((tmp_path / "rose_breakdown.json").read_text())["rows"]
    assert [r["tokens"] for r in rows] == [16, 64]
    assert all(r["host_to_host_p50_ms"] > 0 and r["weight_bytes"] > 0 for r in rows)
