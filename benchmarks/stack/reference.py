"""`python -m benchmarks.stack.reference --model-dir DIR --out FILE`: the warm-up verification's reference.

Computes the probe set's embeddings with the model's own reference implementation, so the benchmark
can check that the stack behind a URL embeds correctly before timing it:
- a folder with modules.json: sentence-transformers (its pooling, its Normalize module);
- otherwise plain transformers `AutoModel`, pooling named by --pooling (mean | cls | last), then
  L2-normalized unless --normalize false. Each probe runs alone (no padding, so `last` is exact).
The pplx-embed int8 family (bidirectional Qwen3, tanh-int8 head) is out of scope here; the check
compares by cosine, so a float reference of the same weights still works where one exists.
Float32 is the default dtype: the reference should be the precise side of the comparison.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from benchmarks.stack.verify import default_probes, write_reference
from rose.flags import add_config_arguments, config_from_args

POOLINGS = ("mean", "cls", "last")
BACKENDS = ("auto", "sentence-transformers", "transformers")


@dataclass(frozen=True)
class ReferenceConfig:
    model_dir: str = field(default="", metadata={"help": "Hugging Face model folder (nothing is downloaded)"})
    out: str = field(default="", metadata={"help": "reference file to write (JSON)"})
    device: str = field(default="cpu", metadata={"help": "torch device: cpu or cuda"})
    dtype: str = field(default="float32", metadata={"help": "float32, bfloat16 or float16"})
    backend: str = field(default="auto", metadata={"help": "auto (sentence-transformers when modules.json "
                                                           "exists), sentence-transformers or transformers"})
    pooling: str | None = field(default=None, metadata={"help": "transformers backend: mean, cls or last"})
    normalize: bool = field(default=True, metadata={"help": "transformers backend: L2-normalize"})
    model: str | None = field(default=None, metadata={"help": "model name to record (default: folder name)"})
    seed: int = field(default=1234, metadata={"help": "seed of the corpus probes"})


class ReferenceError(RuntimeError):
    """The reference cannot be computed as asked (missing folder, unknown pooling)."""


def _torch_dtype(name: str) -> Any:
    import torch

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if name not in dtypes:
        raise ReferenceError(f"--dtype must be one of {', '.join(dtypes)}")
    return dtypes[name]


def embed_sentence_transformers(model_dir: Path, probes: list[str], device: str, dtype: str) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(model_dir), device=device, local_files_only=True,
                                model_kwargs={"dtype": _torch_dtype(dtype)})
    out = model.encode(probes, batch_size=1, convert_to_tensor=True)
    return out.float().cpu().numpy()


def embed_transformers(model_dir: Path, probes: list[str], device: str, dtype: str, pooling: str,
                       normalize: bool) -> np.ndarray:
    import torch
    from transformers import AutoModel, AutoTokenizer

    if pooling not in POOLINGS:
        raise ReferenceError(f"--pooling must be one of {', '.join(POOLINGS)} for a folder without modules.json")
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model = AutoModel.from_pretrained(str(model_dir), local_files_only=True, dtype=_torch_dtype(dtype))
    model = model.to(device).eval()
    rows = []
    with torch.inference_mode():
        for text in probes:  # one at a time: no padding, so mean and last need no mask
            inputs = tokenizer(text, return_tensors="pt", truncation=True).to(device)
            hidden = model(**inputs).last_hidden_state[0].float()
            pooled = {"mean": lambda h: h.mean(0), "cls": lambda h: h[0], "last": lambda h: h[-1]}[pooling](hidden)
            if normalize:
                pooled = torch.nn.functional.normalize(pooled, dim=0)
            rows.append(pooled.cpu().numpy())
    return np.stack(rows)


def compute(config: ReferenceConfig) -> tuple[list[str], np.ndarray, dict[str, Any]]:
    model_dir = Path(config.model_dir)
    if not (model_dir / "config.json").is_file():
        raise ReferenceError(f"{model_dir} is not a model folder (no config.json)")
    if config.backend not in BACKENDS:
        raise ReferenceError(f"--backend must be one of {', '.join(BACKENDS)}")
    backend = config.backend
    if backend == "auto":
        backend = "sentence-transformers" if (model_dir / "modules.json").is_file() else "transformers"
    probes = default_probes(config.seed)
    if backend == "sentence-transformers":
        matrix = embed_sentence_transformers(model_dir, probes, config.device, config.dtype)
        pooling, normalize = "from modules.json", None
    else:
        if config.pooling is None:
            raise ReferenceError("no modules.json: name the pooling with --pooling mean|cls|last")
        matrix = embed_transformers(model_dir, probes, config.device, config.dtype, config.pooling,
                                    config.normalize)
        pooling, normalize = config.pooling, config.normalize
    if not np.all(np.isfinite(matrix)):
        raise ReferenceError("the reference embeddings contain NaN or inf (try --dtype float32)")
    import torch

    meta = {"model": config.model or model_dir.name, "model_dir": str(model_dir), "backend": backend,
            "pooling": pooling, "normalize": normalize, "device": config.device, "dtype": config.dtype,
            "torch": torch.__version__}
    return probes, matrix, meta


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stack.reference",
                                     description="Compute the verification reference for a model folder.")
    add_config_arguments(parser, ReferenceConfig, "BENCH_REF")
    config = config_from_args(ReferenceConfig, parser.parse_args(argv), "BENCH_REF")
    if not config.model_dir or not config.out:
        print("error: --model-dir and --out are required", file=sys.stderr)
        return 2
    try:
        probes, matrix, meta = compute(config)
    except ReferenceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    write_reference(Path(config.out), probes, matrix, meta)
    print(f"wrote {config.out}: {len(probes)} probes x {matrix.shape[1]} dimensions ({meta['backend']})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
