"""The model factory: which layer stack a model folder gets (built on whatever device is current)."""

from __future__ import annotations

from torch import nn

from rose.models.bert import BertModel
from rose.models.gemma3 import Gemma3TextModel
from rose.models.qwen3 import DecoderOptions, Qwen3Model
from rose.spec import ModelFolderError, ModelSpec

__all__ = ["BertModel", "Gemma3TextModel", "Qwen3Model", "build_model"]


def build_model(spec: ModelSpec) -> nn.Module:
    cfg = spec.config
    try:
        if spec.arch == "bert":
            offset = int(cfg.get("pad_token_id", 1)) + 1 if spec.family in ("roberta", "xlm-roberta") else 0
            return BertModel(cfg, position_offset=offset)
        if spec.arch == "qwen3":  # Qwen3, pplx-embed, Qwen2, Mistral
            return Qwen3Model(cfg, causal=spec.causal, options=DecoderOptions.for_family(spec.family, cfg),
                              windows=spec.layer_windows)
        if spec.arch == "gemma3":
            return Gemma3TextModel(cfg, causal=spec.causal, windows=spec.layer_windows)
    except (KeyError, ValueError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ModelFolderError(f"{spec.model_dir / 'config.json'}: {detail}") from None
    raise ModelFolderError(f"{spec.model_dir}: no layer stack for architecture {spec.arch!r}")
