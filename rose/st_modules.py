"""The sentence-transformers pipeline of a model folder (modules.json), torch-free.

Both layouts are read: the classic one (types `sentence_transformers.models.X`, the Pooling config's
`pooling_mode_*_token(s)` booleans, `word_embedding_dimension`) and the one sentence-transformers 6 writes
(types `sentence_transformers.base.modules.<file>.X` / `sentence_transformers.sentence_transformer.modules
.<file>.X`, Pooling `{"embedding_dimension", "pooling_mode": "cls"}`). What ROSE applies: Transformer (the
folder's root), Pooling (mean, cls, last token), Dense (linear + activation, after pooling, on the device),
Normalize (last), Dropout (nothing at inference). Any other module, or a setting of these that ROSE does not
apply, is refused with an error naming the module's type and folder: never skipped, never served wrong.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rose.spec import ModelFolderError
from rose.spec import _read_json as _read

# Pooling modes: ST6 names -> ROSE's; the classic boolean keys -> ST6 names (ST's own conversion table).
POOLING_MODES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}
LEGACY_POOLING_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                       "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}
# Dense activation_function (sentence-transformers saves the class's full name) -> ROSE's name for it.
ACTIVATIONS = {"torch.nn.modules.linear.Identity": "identity", "torch.nn.modules.activation.Tanh": "tanh",
               "torch.nn.modules.activation.ReLU": "relu", "torch.nn.modules.activation.GELU": "gelu",
               "torch.nn.modules.activation.Sigmoid": "sigmoid", "torch.nn.modules.activation.SiLU": "silu"}
DEFAULT_ACTIVATION = "torch.nn.modules.activation.Tanh"  # Dense's default when its config names none
APPLIED = ("Transformer", "Pooling", "Dense", "Normalize", "Dropout")
SENTENCE = "sentence_embedding"


@dataclass(frozen=True)
class DenseSpec:
    folder: Path  # holds model.safetensors or pytorch_model.bin with linear.weight (and linear.bias)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a value of ACTIVATIONS


@dataclass(frozen=True)
class StPipeline:
    pooling: str | None  # mean | cls | last; None without a Pooling module
    normalize: bool
    dense: tuple[DenseSpec, ...]
    include_prompt: bool


def _config(folder: Path, required: bool) -> dict:
    path = folder / "config.json"
    if not path.is_file() and not required:
        return {}
    cfg = _read(path)
    if not isinstance(cfg, dict):
        raise ModelFolderError(f"{path}: expected a JSON object")
    return cfg


def _pooling(cfg: dict, where: str) -> str:
    """ROSE's pooling for a Pooling config in either layout (as sentence-transformers 6 reads it)."""
    mode = cfg.get("pooling_mode")
    if mode is None:
        legacy = [name for key, name in LEGACY_POOLING_KEYS.items() if cfg.get(key)]
        mode = legacy or "mean"  # no mode set at all: sentence-transformers pools by mean
    modes = [mode] if isinstance(mode, str) else list(mode)
    if len(modes) != 1:
        raise ModelFolderError(f"{where}: unsupported pooling {modes} (concatenated modes); ROSE pools one of "
                               f"{', '.join(POOLING_MODES)}")
    if modes[0] not in POOLING_MODES:
        raise ModelFolderError(f"{where}: unsupported pooling {modes[0]!r}; ROSE pools one of {', '.join(POOLING_MODES)}")
    return POOLING_MODES[modes[0]]


def _refuse_io_names(cfg: dict, where: str, kind: str) -> None:
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key, SENTENCE) not in (SENTENCE, None):
            raise ModelFolderError(f"{where}: {kind} with {key}={cfg[key]!r} is not applied by ROSE "
                                   f"(only the pooled {SENTENCE!r})")


def _dense(folder: Path, cfg: dict, width: int, where: str) -> DenseSpec:
    try:
        in_f, out_f = int(cfg["in_features"]), int(cfg["out_features"])
    except (KeyError, TypeError, ValueError):
        raise ModelFolderError(f"{where}: Dense config needs integer in_features and out_features") from None
    if in_f != width:
        raise ModelFolderError(f"{where}: Dense in_features={in_f}, but the embedding before it has {width} dimensions")
    act = str(cfg.get("activation_function") or DEFAULT_ACTIVATION)
    if act not in ACTIVATIONS:
        raise ModelFolderError(f"{where}: Dense activation_function {act!r} is not applied by ROSE; "
                               f"supported: {', '.join(ACTIVATIONS)}")
    if cfg.get("use_residual"):
        raise ModelFolderError(f"{where}: Dense with use_residual=true is not applied by ROSE")
    _refuse_io_names(cfg, where, "Dense")
    if not any((folder / f).is_file() for f in ("model.safetensors", "pytorch_model.bin")):
        raise ModelFolderError(f"{where}: Dense weights not found (model.safetensors or pytorch_model.bin)")
    return DenseSpec(folder, in_f, out_f, bool(cfg.get("bias", True)), ACTIVATIONS[act])


def read_pipeline(model_dir: Path, hidden_size: int, native_int8: bool = False) -> StPipeline | None:
    """The folder's sentence-transformers pipeline, None without modules.json. native_int8: the family's
    own int8 output (pplx-embed), which a trailing quantizer module of its folder computes as ROSE does."""
    path = model_dir / "modules.json"
    if not path.is_file():
        return None
    modules = _read(path)
    if not modules:
        return None
    if not isinstance(modules, list):
        raise ModelFolderError(f"{path}: expected a list of modules")
    pooling, normalize, include_prompt, dense = None, False, True, []
    width, seen_transformer = hidden_size, False
    for i, module in enumerate(modules):
        if not isinstance(module, dict):
            raise ModelFolderError(f"{path}: module {i} is not an object")
        kind, sub = str(module.get("type", "")), str(module.get("path", "") or "")
        folder, cls = model_dir / sub, kind.rsplit(".", 1)[-1]
        where = f"{path}: module {i} {kind!r} (folder {sub or '.'!r})"
        if native_int8 and cls.endswith("Quantizer") and i == len(modules) - 1:
            continue  # pplx-embed's int8 output: ROSE's own round(127*tanh) for the family
        if not kind.startswith("sentence_transformers.") or cls not in APPLIED:
            raise ModelFolderError(f"{where} is not applied by ROSE (it applies {', '.join(APPLIED)}); refusing "
                                   f"to serve embeddings without it")
        if normalize and cls != "Dropout":
            raise ModelFolderError(f"{where} comes after Normalize; ROSE normalizes last")
        if cls == "Transformer":
            if seen_transformer or i != 0 or sub not in ("", "."):
                raise ModelFolderError(f"{where}: ROSE serves one Transformer, first, at the folder's root")
            seen_transformer = True
        elif cls == "Pooling":
            if pooling is not None or dense:
                raise ModelFolderError(f"{where}: ROSE pools once, before any Dense")
            cfg = _config(folder, required=True)
            dim = cfg.get("embedding_dimension", cfg.get("word_embedding_dimension"))
            if dim is not None and int(dim) != hidden_size:
                raise ModelFolderError(f"{where}: pooling dimension {dim} differs from hidden_size {hidden_size}")
            pooling = _pooling(cfg, f"{folder / 'config.json'}")
            include_prompt = bool(cfg.get("include_prompt", True))
        elif cls == "Dense":
            if pooling is None:
                raise ModelFolderError(f"{where}: a Dense before Pooling (token-level) is not applied by ROSE")
            dense.append(_dense(folder, _config(folder, required=True), width, where))
            width = dense[-1].out_features
        elif cls == "Normalize":
            _refuse_io_names(_config(folder, required=False), where, "Normalize")
            normalize = True
    return StPipeline(pooling, normalize, tuple(dense), include_prompt)
