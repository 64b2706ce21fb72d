"""The in-process embedder: rose.Engine on this machine's GPU (or CPU) behind Ivy's own InputEncoder, so the
templating, character cap, tokenization and truncation are those of /v1/embeddings for the same options, and
rose.apply_head (inside Engine.embed) is Tulip's. Worker threads tokenize in parallel (HF tokenizers drops
the GIL); the engine runs one batch at a time under a lock, so tokenizing batch n+1 overlaps running n.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import numpy as np

from ivy.config import IvyConfig
from ivy.encode import WIRE_ENCODING
from ivy.errors import IvyError
from ivy.index.client import FatalError, RowError
from ivy.tokenization import InputEncoder
from rose.head import OutputOptions
from rose.spec import bundled_model_dir

_INPUT_PARAM = re.compile(r"^input\[(\d+)\]")


class LocalEmbedder:
    def __init__(self, model: str, *, options: dict, encoding: str, device: str, dtype: str, threads: int) -> None:
        from rose.engine import Engine  # torch: only in-process runs need it

        model_dir = bundled_model_dir() if model == "bundled" else Path(model)
        self.engine = Engine.from_pretrained(model_dir, device=device or None, dtype=dtype or None)
        spec = self.engine.spec
        if self.engine.info.device.startswith("cuda"):
            self.engine.warmup()  # capture and verify the prewarm graphs before the corpus arrives
        defaults = IvyConfig()  # the gateway's defaults: the same character cap and split thresholds
        self.encoder = InputEncoder(spec, self.engine.tokenizer, threads=threads,
                                    char_cap=defaults.char_cap(spec.max_length),
                                    split_chars=defaults.tokenize_split_chars,
                                    piece_chars=defaults.tokenize_piece_chars)
        try:
            self.prompt = self.encoder.prompt_for(options.get("input_type"), options.get("prompt_name"))
        except IvyError as exc:
            raise FatalError(exc.message) from None
        dims = options.get("dimensions") or 0
        if not 0 <= dims <= spec.dimensions:
            raise FatalError(f"dimensions must be between 1 and {spec.dimensions} for this model, got {dims}")
        self.truncate, self.side = bool(options.get("truncate")), options.get("truncation_side", "right")
        self.options = OutputOptions(dimensions=dims, normalize=options.get("normalize"),
                                     encoding=WIRE_ENCODING[encoding])
        self.model_name = spec.model_id
        self.card_dimensions = spec.dimensions
        self._lock = threading.Lock()

    def embed(self, texts: list[str]) -> tuple[np.ndarray, int]:
        try:  # InputEncoder's synchronous body: these are already worker threads, not an event loop
            seqs = self.encoder._encode_texts(texts, self.truncate, self.side, self.prompt, "input")
        except IvyError as exc:
            match = _INPUT_PARAM.match(exc.param or "")
            raise RowError(exc.message, int(match.group(1)) if match else None, exc.param) from None
        with self._lock:
            rows = self.engine.embed(seqs, options=self.options)
        return rows, sum(map(len, seqs))

    def close(self) -> None:
        self.encoder.close()
        self.engine.close()
