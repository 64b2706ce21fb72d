"""Sparse and multi-vector folders: which retrieval heads a folder has and the columns of its native row (torch-free).

ROSE's native row per span holds every output the model has, side by side; a request names the one it wants
(EmbedRequest.output) and Tulip slices those columns (`Output.start`, `Output.width`):
- SPLADE (sentence-transformers SparseEncoder: Transformer with transformer_task "fill-mask" or the older
  MLMTransformer, then SpladePooling; a BertForMaskedLM checkpoint): output `vocab-weights`, one row of vocabulary
  width per sequence: log(1 + relu(MLM logits)) (twice log1p for activation "log1p_relu"), max (or sum) over the
  sequence's tokens, computed on the device (rose.retrieval_head). The host keeps the non-zero entries.
- BGE-M3 (an XLM-R folder with FlagEmbedding's colbert_linear.pt and sparse_linear.pt beside the weights):
  `embed` (the hidden state, CLS-pooled and normalized as its sentence-transformers pipeline says), then per
  one-token span `token-vectors` (colbert_linear(h), L2-normalized: its multi-vector output) and `token-weights`
  (relu(sparse_linear(h)), one weight per token: its sparse output, max over repeated ids on the host).
Which tokens count (BGE-M3's reference): multi-vector rows for every token but the first (CLS), the final
</s> kept; sparse weights for every token whose id is not the cls, eos, pad or unk token, only weights > 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rose.spec import ModelFolderError, Output, _optional_json, _read_json, find_output

EMBED, VOCAB_WEIGHTS, TOKEN_WEIGHTS, TOKEN_VECTORS = "embed", "vocab-weights", "token-weights", "token-vectors"
TASK_OF_OUTPUT = {EMBED: "embed", VOCAB_WEIGHTS: "sparse", TOKEN_WEIGHTS: "sparse", TOKEN_VECTORS: "multi-vector"}
M3_FILES = ("colbert_linear.pt", "sparse_linear.pt")
SPLADE_TRANSFORMERS = ("MLMTransformer", "Transformer")


@dataclass(frozen=True)
class RetrievalHeads:
    kind: str  # splade | m3
    outputs: tuple[Output, ...]
    splade_pooling: str = "max"  # splade: max | sum over a sequence's tokens
    splade_activation: str = "relu"  # splade: relu | log1p_relu
    colbert_dim: int = 0  # m3: width of colbert_linear's output
    max_active_dims: int = 0  # splade: config_sentence_transformers.json's, the weights kept per input; 0 = all

    @property
    def width(self) -> int:
        return sum(o.width for o in self.outputs)

    def output(self, name: str) -> Output | None:
        return find_output(self.outputs, name)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(TASK_OF_OUTPUT[o.name] for o in self.outputs))


def _splade_modules(model_dir: Path) -> tuple[dict, Path] | None:
    """SpladePooling's config and the folder, None when modules.json has no SpladePooling; other modules refused."""
    path = model_dir / "modules.json"
    modules = _optional_json(path) or []
    if not isinstance(modules, list) or not any(isinstance(m, dict) and str(m.get("type", "")).endswith(
            ".SpladePooling") for m in modules):
        return None
    names = [str(m.get("type", "")).rsplit(".", 1)[-1] if isinstance(m, dict) else "" for m in modules]
    if len(modules) != 2 or names[0] not in SPLADE_TRANSFORMERS or names[1] != "SpladePooling":
        raise ModelFolderError(f"{path}: modules {names}; ROSE serves SPLADE folders of exactly a Transformer "
                               "(fill-mask) then SpladePooling (no SparseStaticEmbedding, SparseAutoEncoder, ...)")
    if str(modules[0].get("path", "") or "") not in ("", "."):
        raise ModelFolderError(f"{path}: ROSE serves one Transformer at the folder's root")
    sub = str(modules[1].get("path", "") or "")
    return _read_json(model_dir / sub / "config.json"), model_dir / sub / "config.json"


def _splade(model_dir: Path, config: dict[str, Any], arch: str, family: str) -> RetrievalHeads | None:
    found = _splade_modules(model_dir)
    if found is None:
        return None
    pooling_cfg, where = found
    name = str((config.get("architectures") or [""])[0])
    if family != "bert" or arch != "bert" or name != "BertForMaskedLM":
        raise ModelFolderError(f"{model_dir / 'config.json'}: a SPLADE folder of architecture {name!r}; ROSE serves "
                               "BertForMaskedLM SPLADE models")
    sbert = _optional_json(model_dir / "sentence_bert_config.json") or {}
    if sbert.get("transformer_task", "fill-mask") != "fill-mask":
        raise ModelFolderError(f"{model_dir / 'sentence_bert_config.json'}: transformer_task "
                               f"{sbert['transformer_task']!r}; SpladePooling needs the MLM logits (fill-mask)")
    strategy = pooling_cfg.get("pooling_strategy", "max")
    activation = pooling_cfg.get("activation_function", "relu")
    if strategy not in ("max", "sum") or activation not in ("relu", "log1p_relu"):
        raise ModelFolderError(f"{where}: SpladePooling pooling_strategy={strategy!r} activation_function="
                               f"{activation!r}; ROSE applies max | sum and relu | log1p_relu")
    vocab = int(config["vocab_size"])
    st_config = model_dir / "config_sentence_transformers.json"
    top = (_optional_json(st_config) or {}).get("max_active_dims")  # SparseEncoder's default top-k per input
    if top is not None and (type(top) is not int or top < 1):
        raise ModelFolderError(f"{st_config}: max_active_dims must be a positive whole number or null, got {top!r}")
    return RetrievalHeads("splade", (Output(VOCAB_WEIGHTS, 0, vocab, False),), strategy, activation,
                          max_active_dims=top or 0)


def _m3(model_dir: Path, family: str, hidden: int, normalize: bool) -> RetrievalHeads | None:
    present = [f for f in M3_FILES if (model_dir / f).is_file()]
    if not present:
        return None
    if len(present) != len(M3_FILES) or family != "xlm-roberta":
        raise ModelFolderError(f"{model_dir}: found {present} of BGE-M3's {list(M3_FILES)} in a {family} folder; "
                               "ROSE serves BGE-M3 (XLM-R with both heads)")
    colbert = hidden  # FlagEmbedding's default colbert_dim=-1: as wide as the hidden state (checked on loading)
    outputs = (Output(EMBED, 0, hidden, normalize), Output(TOKEN_VECTORS, hidden, colbert, True),
               Output(TOKEN_WEIGHTS, hidden + colbert, 1, False))
    return RetrievalHeads("m3", outputs, colbert_dim=colbert)


def read_retrieval_heads(model_dir: Path, config: dict[str, Any], family: str, arch: str,
                         normalize: bool) -> RetrievalHeads | None:
    """The folder's sparse / multi-vector heads; None for a plain embedding model."""
    splade = _splade(model_dir, config, arch, family)
    return splade if splade is not None else _m3(model_dir, family, int(config["hidden_size"]), normalize)


def is_splade_folder(model_dir: Path) -> bool:
    """Whether modules.json lists a SpladePooling (then rose.st_modules' pipeline does not apply)."""
    try:
        return _splade_modules(model_dir) is not None
    except ModelFolderError:
        return True
