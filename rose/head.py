"""The output head applied per request to the engine's native rows (host side, numpy).

Native rows are what `Engine.step()` returns: the pooled hidden states, not yet normalized, for float
families; round(127*tanh(x)) int8 values (as float32) for pplx-embed. Per request: Matryoshka truncation
to `dimensions`, then L2 normalization when normalizing (by default when the model's sentence-transformers
pipeline normalizes), then the wire encoding. A classifier's native rows are its logits; `label_scores` turns
them into what a client asked for (Ivy's /predict and /classify).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np


class Encoding(enum.IntEnum):  # values equal protos' tulip.v1.Encoding
    FLOAT32 = 0
    INT8 = 1
    BINARY = 2


@dataclass(frozen=True)
class OutputOptions:
    dimensions: int = 0  # 0 = the model's full width
    normalize: bool | None = None  # None = the model's default
    encoding: Encoding = Encoding.FLOAT32


def apply_head(rows: np.ndarray, options: OutputOptions, *, native_int8: bool, default_normalize: bool) -> np.ndarray:
    """rows: float32 [n, dim] native output. Returns float32 [n, d], int8 [n, d] or uint8 [n, ceil(d/8)]."""
    x = np.asarray(rows, dtype=np.float32)
    if options.dimensions:
        if not 0 < options.dimensions <= x.shape[1]:
            raise ValueError(f"dimensions {options.dimensions} is not between 1 and the model's {x.shape[1]}")
        x = x[:, : options.dimensions]
    normalize = default_normalize if options.normalize is None else options.normalize
    if options.encoding == Encoding.INT8:
        if native_int8:
            return np.ascontiguousarray(x, dtype=np.float32).astype(np.int8)
        # Symmetric per-row quantization of the (normalized) float vector.
        x = _l2_normalize(x) if normalize else x
        scale = np.maximum(np.abs(x).max(axis=1, keepdims=True), 1e-12) / 127.0
        return np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
    if options.encoding == Encoding.BINARY:
        return np.packbits(x > 0, axis=1, bitorder="little")
    if normalize:
        x = _l2_normalize(x)
    return np.ascontiguousarray(x, dtype=np.float32)


def _l2_normalize(x: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def label_scores(logits: np.ndarray, *, multi_label: bool, raw: bool = False) -> np.ndarray:
    """float32 [n, labels] per-label scores from a classifier's logits, as transformers' text-classification
    pipeline scores them: softmax over the labels, or each label's sigmoid for a multi-label model
    (problem_type multi_label_classification); `raw`: the logits themselves (TEI's raw_scores)."""
    x = np.asarray(logits, dtype=np.float64)
    if raw:
        return x.astype(np.float32)
    if multi_label:
        return (1.0 / (1.0 + np.exp(-x))).astype(np.float32)
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).astype(np.float32)
