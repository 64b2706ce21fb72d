"""The model factory: which layer stack a model folder gets (built on whatever device is current)."""

from __future__ import annotations

from torch import nn

from rose.models.bert import BertModel
from rose.models.distilbert import DistilBertModel
from rose.models.gemma3 import Gemma3TextModel
from rose.models.gte import NewModel
from rose.models.modernbert import ModernBertModel
from rose.models.mpnet import MPNetModel
from rose.models.nomic_bert import NomicBertModel
from rose.models.qwen3 import DecoderOptions, Qwen3Model
from rose.spec import ModelFolderError, ModelSpec

__all__ = ["BertModel", "DistilBertModel", "Gemma3TextModel", "MPNetModel", "ModernBertModel", "NewModel",
           "NomicBertModel", "Qwen3Model", "build_model"]
# arch -> the class built from config.json alone
ENCODERS = {"modernbert": ModernBertModel, "mpnet": MPNetModel, "distilbert": DistilBertModel, "gte": NewModel,
            "nomic_bert": NomicBertModel}


def build_model(spec: ModelSpec) -> nn.Module:
    cfg = spec.config
    try:
        if spec.arch == "bert":
            offset = int(cfg.get("pad_token_id", 1)) + 1 if spec.family in ("roberta", "xlm-roberta") else 0
            return BertModel(cfg, position_offset=offset, token_types=spec.type_vocab_size > 1)
        if spec.arch == "qwen3":  # Qwen3, pplx-embed, Qwen2, Mistral
            return Qwen3Model(cfg, causal=spec.causal, options=DecoderOptions.for_family(spec.family, cfg),
                              windows=spec.layer_windows)
        if spec.arch == "gemma3":
            return Gemma3TextModel(cfg, causal=spec.causal, windows=spec.layer_windows)
        if spec.arch in ENCODERS:
            return ENCODERS[spec.arch](cfg)
    except (KeyError, ValueError) as exc:
        detail = f"missing field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise ModelFolderError(f"{spec.model_dir / 'config.json'}: {detail}") from None
    raise ModelFolderError(f"{spec.model_dir}: no layer stack for architecture {spec.arch!r}")
