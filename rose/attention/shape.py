"""A model's attention shape: what kernels that plan on the host (FlashInfer) or compile per shape need
before the first forward, and what the A/B benchmark and the kernel build step measure."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AttentionShape:
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    causal: bool = False

    @property
    def scale(self) -> float:
        """Softmax scale: 1/sqrt(head_dim) in every family ROSE serves (BERT and Qwen3)."""
        return self.head_dim ** -0.5

    @property
    def group(self) -> int:
        """Query heads per KV head (GQA ratio)."""
        return self.num_qo_heads // self.num_kv_heads

    @classmethod
    def from_spec(cls, spec) -> AttentionShape:
        """The shape of a loaded model folder (rose.spec.ModelSpec)."""
        cfg = spec.config
        heads = int(cfg["num_attention_heads"])
        if spec.arch == "qwen3":
            kv = int(cfg.get("num_key_value_heads") or heads)
            head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // heads)
            return cls(heads, kv, head_dim, bool(spec.causal))
        return cls(heads, heads, int(cfg["hidden_size"]) // heads, False)  # BERT family: bidirectional MHA


# The attention shapes of the benchmark models (rose.benchmarks.model_zoo names), bidirectional as served
# by pplx-embed; Qwen3-Embedding runs the same shapes causally.
NAMED_SHAPES = {
    "qwen3-0.6b": AttentionShape(16, 8, 128),
    "qwen3-4b": AttentionShape(32, 8, 128),
    "minilm-l6": AttentionShape(12, 12, 32),
}
NAMED_MAX_LENGTH = {"qwen3-0.6b": 32768, "qwen3-4b": 32768, "minilm-l6": 512}
