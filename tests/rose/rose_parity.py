"""Reference embeddings from `transformers` hidden states, pooled by hand, and the comparison metrics.

Shared by the CPU tests, the GPU tests and gpu_report.py.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from rose_tiny_models import TinyModel


@torch.no_grad()
def hf_hidden(tiny: TinyModel, seqs: Sequence[Sequence[int]], device: str = "cpu",
              dtype: torch.dtype = torch.float32) -> list[np.ndarray]:
    """Last hidden states per sequence (float64 [L_i, H]) from one right-padded batch with its mask."""
    # A lower-precision reference gets its own copy: casting the shared model would lose its weights.
    model = tiny.hf.to(device) if dtype == torch.float32 else copy.deepcopy(tiny.hf).to(device=device, dtype=dtype)
    lens = [len(s) for s in seqs]
    width = max(lens)
    ids = torch.full((len(seqs), width), tiny.pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    if tiny.bidirectional_mask:
        # Non-causal Qwen3: a ready 4D additive mask is used as is (transformers skips its causal mask).
        full = torch.zeros((len(seqs), 1, width, width), dtype=dtype)
        full.masked_fill_(mask[:, None, None, :] == 0, torch.finfo(dtype).min)
        attn = full.to(device)
    else:
        attn = mask.to(device)
    out = model(input_ids=ids.to(device), attention_mask=attn).last_hidden_state
    rows = [out[i, :n].double().cpu().numpy() for i, n in enumerate(lens)]
    tiny.hf.to("cpu")
    return rows


def pool(hidden: np.ndarray, pooling: str) -> np.ndarray:
    if pooling == "mean":
        return hidden.mean(axis=0)
    if pooling == "cls":
        return hidden[0]
    if pooling == "last":
        return hidden[-1]
    raise ValueError(pooling)


def reference_rows(tiny: TinyModel, seqs, pooling: str | None = None, device: str = "cpu",
                   dtype: torch.dtype = torch.float32, hidden=None) -> np.ndarray:
    """What Engine.embed must return: pooled, through the Dense modules, pplx-transformed, normalized as the
    model's default."""
    hidden = hidden if hidden is not None else hf_hidden(tiny, seqs, device, dtype)
    rows = np.stack([pool(h, pooling or tiny.pooling) for h in hidden])
    for weight in tiny.dense:
        rows = rows @ weight.double().numpy().T
    if tiny.native_int8:
        rows = np.round(127.0 * np.tanh(rows))
    if tiny.normalize:
        rows = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def random_seqs(tiny: TinyModel, lengths: Sequence[int], seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [tiny.random_ids(rng, n) for n in lengths]


def attention_written_out(q, k, v, lengths, causal, window, scale):
    """Attention per sequence with the band as a boolean mask, in float64, GQA by repeating K/V."""
    out, at = [], 0
    rep = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (x[at:at + n].double().transpose(0, 1) for x in (q, k, v))
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        visible = ((i - j).abs() <= window) & ((j <= i) if causal else True)
        scores = (qs @ ks.transpose(1, 2) * scale).masked_fill(~visible, float("-inf"))
        out.append((scores.softmax(-1) @ vs).transpose(0, 1))
        at += n
    return torch.cat(out)


def persistent_engine_parity(tiny: TinyModel, seqs: Sequence[Sequence[int]], ref: np.ndarray,
                             routed: str = "on") -> dict:
    """A GPU engine with ROSE_PERSISTENT_DECODER=`routed` embeds `seqs` three times (the layout's eager warm-up, its
    checked capture, a replay) and once eagerly at its exact size. Returns the worst divergence from `ref` per
    way, how many forwards the persistent kernel had run after each of the three, each run's first and last step
    with its forward's step count, and the engine's stats; AssertionError when the kernel did not attach."""
    from rose import Batch
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny.path, device="cuda", dtype="bfloat16", prewarm=(), graph_manifest=None,
                                    persistent_decoder=routed)
    try:
        engine.warmup()  # routes to the kernel from here on (its warm launch, then the probe batch)
        decoder = engine.runner.model.persistent
        assert decoder is not None, "the persistent decoder did not attach (its log line says why)"
        runs, run = [], decoder.run
        # each run's (first, last) step and its forward's step count (its token block's: steps(T))
        decoder.run = lambda *args, **kwargs: (runs.append((*args[1:3], decoder.steps(args[0].residual.shape[0]))),
                                               run(*args, **kwargs))[1]
        worst, seen = {}, []
        for way in ("eager", "capture", "replay"):
            worst[way] = float(1.0 - cosine(engine.embed(seqs), ref).min())
            seen.append(len(runs))
        batch = Batch.from_sequences(seqs, engine.spec.pooling)
        worst["exact-size eager"] = float(1.0 - cosine(engine.runner.step(batch, use_graphs=False).result(), ref).min())
        return {"worst": worst, "seen": seen, "runs": runs, "stats": engine.stats()}
    finally:
        engine.close()

