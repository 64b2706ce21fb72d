"""The model factory: which layer stack a model folder gets (built on whatever device is current)."""

from __future__ import annotations

from torch import nn

from rose.models.bert import BertModel
from rose.models.qwen3 import Qwen3Model
from rose.spec import ModelFolderError, ModelSpec

__all__ = ["BertModel", "Qwen3Model", "build_model"]


def build_model(spec: ModelSpec) -> nn.Module:
    cfg = spec.config
    try:
        if spec.arch == "bert":
            offset = int(cfg.get("pad_token_id", 1)) + 1 if spec.family in ("roberta", "xlm-roberta") else 0
            return BertModel(cfg, position_offset=offset, token_types=spec.type_vocab_size > 1)
        if spec.arch == "qwen3":
            return Qwen3Model(cfg, causal=spec.causal)
    except (KeyError, ValueError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ModelFolderError(f"{spec.model_dir / 'config.json'}: {detail}") from None
    raise ModelFolderError(f"{spec.model_dir}: no layer stack for architecture {spec.arch!r}")
