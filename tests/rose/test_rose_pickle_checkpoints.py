"""Folders whose weights are PyTorch pickles (pytorch_model.bin, or shards named by pytorch_model.bin.index.json),
as older BERT / XLM-R checkpoints and some cross-encoders ship: the same rows as the folder's safetensors twin
(and as transformers / sentence-transformers on the .bin), the same errors, read with weights_only=True (a pickle
that would run code is refused by name, never run) and memory-mapped when the file is a zip; safetensors
wins when both are there."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from rose_cross_models import (
    PAIRS,
    build_qwen3_reranker,
    build_xlmr_ce,
    cross_encoder_scores,
    qwen3_recipe_ids,
    qwen3_yes_probability,
)
from rose_parity import cosine, random_seqs, reference_rows
from rose_st_folders import st_rows
from safetensors.torch import load_file

from rose.engine import Engine
from rose.loader import WeightLoadError, load_tensors

SINGLE, INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"


def pickle_folder(src: Path, dst: Path, shards: int = 1, legacy: bool = False) -> Path:
    """A copy of `src` whose weights are pytorch_model.bin (or `shards` pytorch_model-0000i-of-0000n.bin and their
    index, the layout transformers writes), with no safetensors left; `legacy`: the pre-1.6 non-zip format."""
    shutil.copytree(src, dst)
    state: dict[str, torch.Tensor] = {}
    for file in sorted(dst.glob("*.safetensors")):
        state.update(load_file(str(file)))
        file.unlink()
    (dst / "model.safetensors.index.json").unlink(missing_ok=True)
    extra = {"_use_new_zipfile_serialization": False} if legacy else {}
    if shards == 1:
        torch.save(state, dst / SINGLE, **extra)
        return dst
    weight_map = {}
    names = list(state)
    for i in range(shards):
        shard = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = names[i * len(names) // shards:(i + 1) * len(names) // shards]
        torch.save({name: state[name] for name in part}, dst / shard, **extra)
        weight_map.update(dict.fromkeys(part, shard))
    total = sum(t.numel() * t.element_size() for t in state.values())
    (dst / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}))
    return dst


class _Payload:
    """Unpickling this calls exec: it creates `marker`. What a weights_only load must refuse before calling."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return exec, (f"open({str(self.marker)!r}, 'w').close()",)


def write_malicious(path: Path, marker: Path, form: str) -> Path:
    """A weights file carrying the payload next to a real tensor: a zip (torch >= 1.6), legacy or bare pickle."""
    if form == "raw":
        import pickle

        path.write_bytes(pickle.dumps({"embeddings.word_embeddings.weight": _Payload(marker)}, protocol=2))
    else:
        torch.save({"pooler.dense.bias": torch.zeros(4), "payload": _Payload(marker)}, path,
                   _use_new_zipfile_serialization=form == "zip")
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("pickle-checkpoints")


@pytest.fixture
def torch_loads(monkeypatch):
    """Records (file name, weights_only, mmap) of each torch.load while the test runs."""
    calls: list[tuple[str, object, object]] = []
    real = torch.load

    def spy(f, *args, **kwargs):
        calls.append((Path(f).name, kwargs.get("weights_only"), kwargs.get("mmap")))
        return real(f, *args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    return calls


def engine(path) -> Engine:
    return Engine.from_pretrained(path, device="cpu", dtype=torch.float32)


@pytest.mark.parametrize("name,legacy", [("bert", False), ("bert", True), ("xlm-roberta", False)])
def test_bin_folder_embeds_as_its_safetensors_twin(name, legacy, root, tiny_models, engine_for, torch_loads):
    tiny = tiny_models[name]
    folder = pickle_folder(tiny.path, root / f"{name}-bin{'-legacy' if legacy else ''}", legacy=legacy)
    assert not list(folder.glob("*.safetensors"))
    seqs = random_seqs(tiny, [1, 5, 17, 40], seed=21)
    twin = engine_for(name).embed(seqs)
    torch_loads.clear()
    bin_engine = engine(folder)
    try:
        ours = bin_engine.embed(seqs)
    finally:
        bin_engine.close()
    assert torch_loads and all(c == (SINGLE, True, not legacy) for c in torch_loads), torch_loads  # mmap unless legacy
    assert np.abs(ours - twin).max() <= 1e-6
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999  # transformers on the same weights
    assert cosine(ours, st_rows(folder, seqs)).min() >= 0.9999  # sentence-transformers loading the .bin itself


def test_sharded_bin_reads_each_shard_once(root, tiny_models, engine_for, torch_loads):
    tiny = tiny_models["bert"]
    folder = pickle_folder(tiny.path, root / "bert-bin-sharded", shards=3)
    seqs = random_seqs(tiny, [2, 9, 33], seed=22)
    bin_engine = engine(folder)
    try:
        ours = bin_engine.embed(seqs)
    finally:
        bin_engine.close()
    assert np.abs(ours - engine_for("bert").embed(seqs)).max() <= 1e-6
    shards = sorted(c[0] for c in torch_loads if c[0].startswith("pytorch_model-"))
    assert shards == [f"pytorch_model-{i:05d}-of-00003.bin" for i in (1, 2, 3)], torch_loads  # one read each
    assert all(c[1:] == (True, True) for c in torch_loads if c[0].startswith("pytorch_model-"))


def test_cross_encoders_from_bin(root):
    """The classifier head and the yes/no head (two rows of lm_head, rows=) come through load_tensors."""
    xlmr = build_xlmr_ce(root)
    xlmr_bin = pickle_folder(xlmr, root / "xlmr-ce-bin")
    reranker = build_qwen3_reranker(root)
    reranker_bin = pickle_folder(reranker, root / "qwen3-reranker-bin", shards=2)
    seqs = [qwen3_recipe_ids(reranker, q, d) for q, d in PAIRS]
    engines = {p: engine(p) for p in (xlmr, xlmr_bin, reranker, reranker_bin)}
    try:
        def scores(path):
            encoded = engines[path].tokenizer.encode_pairs(PAIRS)
            return engines[path].embed([p.ids for p in encoded], token_types=[p.type_ids for p in encoded])[:, 0]

        got = scores(xlmr_bin)
        assert np.abs(got - scores(xlmr)).max() <= 1e-6
        assert np.abs(got - cross_encoder_scores(xlmr_bin, PAIRS)).max() <= 1e-4  # CrossEncoder reading the .bin
        yes_no = engines[reranker_bin].embed(seqs)[:, 0]
        assert np.abs(yes_no - engines[reranker].embed(seqs)[:, 0]).max() <= 1e-6
        assert np.abs(yes_no - qwen3_yes_probability(reranker, seqs)).max() <= 1e-4
    finally:
        for e in engines.values():
            e.close()


def test_load_tensors_reads_rows_of_a_bin_as_of_safetensors(root, tiny_models):
    src = tiny_models["bert"].path
    folder = pickle_folder(src, root / "bert-bin-rows", shards=2)
    names = {"rows": ("embeddings.word_embeddings.weight",), "bias": ("encoder.layer.1.output.dense.bias",)}
    for rows in ([7, 2, 255], [0]):
        got, want = (load_tensors(p, names, rows={"rows": rows}) for p in (folder, src))
        assert torch.equal(got["rows"], want["rows"]) and got["rows"].shape == (len(rows), 64)
        assert torch.equal(got["bias"], want["bias"])
    for path in (folder, src):
        with pytest.raises(WeightLoadError, match=r"rows \[0, 256\] of 'embeddings\.word_embeddings\.weight' outside"):
            load_tensors(path, names, rows={"rows": [0, 256]})


@pytest.mark.parametrize("form", ["zip", "legacy", "raw", "shard"])
def test_a_pickle_that_would_run_code_is_refused_not_run(form, tmp_path, tiny_models):
    """A real payload: loaded without weights_only it creates a file (checked in a child process); ROSE refuses
    it with an error naming the file, and the file is never created."""
    control = write_malicious(tmp_path / "control.bin", tmp_path / "control-ran", "zip" if form == "shard" else form)
    subprocess.run([sys.executable, "-c", "import sys, torch; torch.load(sys.argv[1], weights_only=False)",
                    str(control)], capture_output=True, check=False)
    assert (tmp_path / "control-ran").exists()  # the payload is live

    marker = tmp_path / "payload-ran"
    if form == "shard":
        folder = pickle_folder(tiny_models["bert"].path, tmp_path / "bert", shards=3)
        bad = write_malicious(folder / "pytorch_model-00002-of-00003.bin", marker, "zip")
    else:
        folder = pickle_folder(tiny_models["bert"].path, tmp_path / "bert")
        bad = write_malicious(folder / SINGLE, marker, form)
    with pytest.raises(WeightLoadError) as err:
        engine(folder)
    assert str(bad) in str(err.value) and "refused" in str(err.value), err.value
    assert "weights_only=False" not in str(err.value)  # torch's advice to load it anyway is not passed on
    in_bad = "embeddings.word_embeddings.weight"
    if form == "shard":  # the heads' reader opens only the shards holding what it asks for
        in_bad = next(k for k, v in json.loads((folder / INDEX).read_text())["weight_map"].items() if v == bad.name)
    with pytest.raises(WeightLoadError, match=f"{bad.name}: refused"):
        load_tensors(folder, {"w": (in_bad,)})
    assert not marker.exists()


@pytest.mark.parametrize("twin", ["bert", "qwen3"])  # single model.safetensors; sharded with its index
def test_safetensors_wins_when_both_are_there(twin, tmp_path, tiny_models, engine_for, torch_loads):
    """Beside the safetensors, a readable .bin of other weights (sharded beside a single file, single beside
    shards): the safetensors rows, no torch.load; without the safetensors the same folder gives the .bin's."""
    tiny = tiny_models[twin]
    folder = tmp_path / twin
    shutil.copytree(tiny.path, folder)
    other = pickle_folder(tiny.path, tmp_path / "bin", shards=1 if twin == "qwen3" else 2)
    gen = torch.Generator().manual_seed(0)
    for file in other.glob("pytorch_model*"):
        if file.suffix == ".bin":
            state = torch.load(file, weights_only=True)
            torch.save({k: v + 0.05 * torch.randn(v.shape, generator=gen) if v.is_floating_point() else v
                        for k, v in state.items()}, folder / file.name)
        else:
            shutil.copy(file, folder / file.name)
    seqs = random_seqs(tiny, [3, 11], seed=23)
    twin_rows = engine_for(twin).embed(seqs)
    torch_loads.clear()
    for expect_bin in (False, True):
        if expect_bin:
            for file in folder.glob("model*.safetensors*"):
                file.unlink()
        both = engine(folder)
        try:
            diff = np.abs(both.embed(seqs) - twin_rows).max()
        finally:
            both.close()
        assert (diff > 1e-3) if expect_bin else (diff <= 1e-6 and not torch_loads), (expect_bin, diff, torch_loads)


@pytest.fixture
def bert_bin(tiny_models, tmp_path):
    return pickle_folder(tiny_models["bert"].path, tmp_path / "bert")


def _edit_bin(folder: Path, edit) -> None:
    state = torch.load(folder / SINGLE, weights_only=True)
    edit(state)
    torch.save(state, folder / SINGLE)


def test_missing_tensor_in_a_bin_is_named(bert_bin):
    _edit_bin(bert_bin, lambda s: s.pop("encoder.layer.1.attention.self.key.weight"))
    with pytest.raises(WeightLoadError, match=r"'encoder\.layer\.1\.attention\.self\.key\.weight' not found in "
                                              r"pytorch_model\.bin"):
        engine(bert_bin)


def test_wrong_shape_in_a_bin_is_named(bert_bin):
    name = "encoder.layer.0.output.dense.weight"
    _edit_bin(bert_bin, lambda s: s.update({name: s[name][:, :64].contiguous()}))
    with pytest.raises(WeightLoadError, match=r"'encoder\.layer\.0\.output\.dense\.weight' has shape \(64, 64\)"):
        engine(bert_bin)


@pytest.mark.parametrize("content,message", [(b"", r"not a readable PyTorch checkpoint \(EOFError"),
                                             (b"not a checkpoint at all" * 10, r"refused: .*Unsupported operand")])
def test_unreadable_bin_is_named(content, message, bert_bin):
    (bert_bin / SINGLE).write_bytes(content)
    with pytest.raises(WeightLoadError, match=r"pytorch_model\.bin: " + message):
        engine(bert_bin)


def test_a_bin_that_is_not_a_state_dict_is_named(bert_bin):
    torch.save([torch.zeros(2)], bert_bin / SINGLE)
    with pytest.raises(WeightLoadError, match=r"pytorch_model\.bin: holds a list, not a state dict"):
        engine(bert_bin)


def test_missing_bin_shard_is_named(tiny_models, tmp_path):
    folder = pickle_folder(tiny_models["bert"].path, tmp_path / "bert", shards=3)
    (folder / "pytorch_model-00002-of-00003.bin").unlink()
    with pytest.raises(WeightLoadError, match=r"pytorch_model-00002-of-00003\.bin: shard named in "
                                              r"pytorch_model\.bin\.index\.json not found"):
        engine(folder)
