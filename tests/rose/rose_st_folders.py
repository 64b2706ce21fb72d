"""Tiny BERT folders with sentence-transformers pipelines past Transformer + Pooling (Dense, Normalize), in
the classic layout (written by hand as sentence-transformers 2.x/3.x wrote it: `sentence_transformers.models.X`
types, `pooling_mode_*` booleans, Dense weights in pytorch_model.bin) and in the layout the installed
sentence-transformers 6 writes (built and saved by it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from rose_tiny_models import build_bert

CLASSIC = "sentence_transformers.models."
TANH = "torch.nn.modules.activation.Tanh"


def _write(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2), encoding="utf-8")


def build_classic_dense(root: Path, pooling: str = "mean", seed: int = 21) -> Path:
    """Transformer, 1_Pooling, 2_Dense (64 -> 32, bias, Tanh), 3_Normalize in the classic layout."""
    path = build_bert(root, "bert", pooling, seed=seed).path
    _write(path / "modules.json", [
        {"idx": 0, "name": "0", "path": "", "type": CLASSIC + "Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": CLASSIC + "Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": CLASSIC + "Dense"},
        {"idx": 3, "name": "3", "path": "3_Normalize", "type": CLASSIC + "Normalize"}])
    _write(path / "2_Dense" / "config.json", {"in_features": 64, "out_features": 32, "bias": True,
                                              "activation_function": TANH})
    gen = torch.Generator().manual_seed(seed)
    torch.save({"linear.weight": 0.3 * torch.randn(32, 64, generator=gen),
                "linear.bias": 0.2 * torch.randn(32, generator=gen)}, path / "2_Dense" / "pytorch_model.bin")
    out = root / "classic-dense"
    shutil.rmtree(out, ignore_errors=True)
    shutil.move(str(path), out)
    return out


def build_st6(root: Path, name: str, pooling: str, dense: list[tuple[int, int, bool, str]],
              normalize: bool, seed: int = 22) -> Path:
    """Saved by sentence-transformers 6: Transformer, Pooling(pooling_mode=pooling), Dense per
    (in, out, bias, torch.nn activation class name), Normalize when asked."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.modules import Dense, Normalize, Transformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    base = build_bert(root, "bert", "mean", seed=seed).path
    torch.manual_seed(seed)
    modules = [Transformer(str(base)), Pooling(64, pooling_mode=pooling)]
    for in_f, out_f, bias, act in dense:
        layer = Dense(in_f, out_f, bias=bias, activation_function=getattr(torch.nn, act)())
        with torch.no_grad():
            layer.linear.weight.normal_(0.0, 0.3)
            if bias:
                layer.linear.bias.normal_(0.0, 0.2)
        modules.append(layer)
    if normalize:
        modules.append(Normalize())
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    SentenceTransformer(modules=modules, device="cpu").save(str(out))
    shutil.rmtree(base)
    return out


def with_module(src: Path, dst: Path, module_type: str, folder: str, config: dict | None = None,
                at: int | None = None) -> Path:
    """A copy of `src` with one more module in modules.json (at index `at`, default last)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    modules = json.loads((dst / "modules.json").read_text())
    entry = {"idx": len(modules), "name": str(len(modules)), "path": folder, "type": module_type}
    modules.insert(len(modules) if at is None else at, entry)
    _write(dst / "modules.json", modules)
    if config is not None:
        _write(dst / folder / "config.json", config)
    return dst


def edit_config(src: Path, dst: Path, folder: str, **changes) -> Path:
    """A copy of `src` whose `folder`/config.json has `changes` (a None value drops the key)."""
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    path = dst / folder / "config.json"
    cfg = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    _write(path, cfg)
    return dst


def st_rows(path, sequences):
    """sentence-transformers' sentence_embedding per sequence on the folder, one at a time (no padding in the
    reference): numpy float64 [len(sequences), width]."""
    import sentence_transformers as st

    model = st.SentenceTransformer(str(path), device="cpu")
    rows = []
    for seq in sequences:
        ids = torch.tensor([seq])
        with torch.no_grad():
            rows.append(model({"input_ids": ids, "attention_mask": torch.ones_like(ids)})["sentence_embedding"][0])
    return torch.stack(rows).double().numpy()
