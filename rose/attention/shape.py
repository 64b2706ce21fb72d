"""A model's attention shape: what kernels that plan on the host (FlashInfer) or compile per shape need
before the first forward, and what the A/B benchmark and the kernel build step measure."""

from __future__ import annotations

from dataclasses import dataclass

from rose.windows import FULL


@dataclass(frozen=True)
class AttentionShape:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool = False
    window: int = FULL  # the sliding window of the model's local layers (FULL: none)
    softmax_scale: float | None = None  # None: 1/sqrt(head_dim)

    @property
    def scale(self) -> float:
        """Softmax scale: 1/sqrt(head_dim), or the model's own (Gemma 3: 1/sqrt(query_pre_attn_scalar))."""
        return self.head_dim ** -0.5 if self.softmax_scale is None else self.softmax_scale

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.num_qo_heads // self.num_kv_heads

    @classmethod
    def from_spec(cls, spec) -> AttentionShape:
        """The shape of a loaded model folder (rose.spec.ModelSpec)."""
        cfg = spec.config
        heads = int(cfg["num_attention_heads"])
        if spec.arch in ("qwen3", "gemma3"):
            kv = int(cfg.get("num_key_value_heads") or heads)
            head_dim = int(cfg.get("head_dim") or (256 if spec.arch == "gemma3" else cfg["hidden_size"] // heads))
            window = max(getattr(spec, "layer_windows", ()), default=FULL)
            scale = float(cfg.get("query_pre_attn_scalar", 256)) ** -0.5 if spec.arch == "gemma3" else None
            return cls(heads, kv, head_dim, bool(spec.causal), window, scale)
        return cls(heads, heads, int(cfg["hidden_size"]) // heads, False)  # BERT family


# The attention shapes of the benchmark models (rose.benchmarks.model_zoo names), bidirectional as served
# by pplx-embed; Qwen3-Embedding runs the same shapes causally.
NAMED_SHAPES = {
    "qwen3-0.6b": AttentionShape(16, 8, 128),
    "qwen3-4b": AttentionShape(32, 8, 128),
    "minilm-l6": AttentionShape(12, 12, 32),
}
NAMED_MAX_LENGTH = {"qwen3-0.6b": 32768, "qwen3-4b": 32768, "minilm-l6": 512}
