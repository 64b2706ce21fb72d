"""A tiny fake OpenAI-compatible stack on loopback, for running the benchmark end to end on a CPU.

Embeddings are deterministic (a fixed random vector per token id of the bundled MiniLM tokenizer,
summed and normalized); usage counts the same tokenizer's tokens, so the tests can check that the
benchmark's inputs have the token counts it asked for.
"""

from __future__ import annotations

import base64
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # `benchmarks` is a folder of the repo, not an installed package
    sys.path.insert(0, str(REPO))

MODEL = "fake-minilm"
MAX_LEN = 512
DIM = 32


@dataclass
class FakeStack:
    url: str
    tokenizer: Any
    table: np.ndarray
    hits: Counter = field(default_factory=Counter)
    received_ids: list = field(default_factory=list)  # token-id inputs of /v1/embeddings, as sent

    def token_ids(self, text: str | list[int]) -> list[int]:
        return text if isinstance(text, list) else self.tokenizer.encode(text).ids

    def embed(self, texts: list[str] | list[list[int]]) -> np.ndarray:
        rows = np.stack([self.table[self.token_ids(t)].sum(0) for t in texts])
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def app_for(stack: FakeStack) -> Any:
    from fastapi import FastAPI, HTTPException

    app = FastAPI()

    @app.get("/health")
    def health() -> dict[str, str]:
        stack.hits["/health"] += 1
        return {"status": "ok"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        stack.hits["/v1/models"] += 1
        return {"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": MAX_LEN}]}

    @app.post("/v1/embeddings")
    def embeddings(body: dict[str, Any]) -> dict[str, Any]:
        stack.hits["/v1/embeddings"] += 1
        if body.get("model") == "broken":
            raise HTTPException(503, "replica unavailable")
        texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if texts and isinstance(texts[0], int):  # one list of token ids
            texts = [texts]
        if texts and isinstance(texts[0], list):
            stack.received_ids.extend(texts)
        tokens = sum(len(stack.token_ids(t)) for t in texts)
        if any(len(stack.token_ids(t)) > MAX_LEN for t in texts):
            raise HTTPException(422, "input too long")
        matrix = stack.embed(texts).astype("<f4")
        encode = (lambda r: base64.b64encode(r.tobytes()).decode()) if body.get("encoding_format") == "base64" \
            else (lambda r: [float(x) for x in r])
        return {"object": "list", "model": MODEL,
                "data": [{"object": "embedding", "index": i, "embedding": encode(r)} for i, r in enumerate(matrix)],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    @app.post("/v1/rerank")
    def rerank(body: dict[str, Any]) -> dict[str, Any]:
        stack.hits["/v1/rerank"] += 1
        matrix = stack.embed([body["query"], *body["documents"]])
        scores = matrix[1:] @ matrix[0]
        tokens = sum(len(stack.token_ids(t)) for t in [body["query"], *body["documents"]])
        order = np.argsort(-scores)
        return {"results": [{"index": int(i), "relevance_score": float(scores[i])} for i in order],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}

    return app
