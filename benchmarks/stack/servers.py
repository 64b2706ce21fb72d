"""What a layer's server is before its suites run: reachable, its max length, a trivial round trip,
and the warm-up verification, for the gateway (HTTP, texts or ids), one Tulip (gRPC) and in-process.

Verification with token ids tokenizes the reference's probes here (context.IdTokenizer) and embeds the
ids, so every layer is checked on what it is measured with. A model with a default prompt gets it only
on the text route (the gateway prepends it; ids go as they are): compare such a model by text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from benchmarks.stack.client import StackClient
from benchmarks.stack.config import BenchConfig
from benchmarks.stack.verify import verify


class IdsFace:
    """The one call verify() makes (`embeddings(texts, encoding_format)`), answered through token ids."""

    def __init__(self, embed_ids: Callable[[Sequence[Sequence[int]]], np.ndarray],
                 tokenize: Callable[[Sequence[str]], list[tuple[int, ...]]]) -> None:
        self._embed, self._tokenize = embed_ids, tokenize

    def embeddings(self, texts: list[str], encoding_format: str | None = None) -> tuple[np.ndarray, None]:
        return np.asarray(self._embed(self._tokenize(texts)), dtype=np.float32), None


def http_server(config: BenchConfig, client: StackClient) -> dict[str, Any]:
    """The gateway's (or a peer's) model listing, max length and a trivial round trip; raises
    connection.HTTPError when it cannot be reached."""
    client.http.get("/v1/models")
    max_length = config.max_length or client.max_length()
    return {"models": client.models(), "max_length": max_length,
            "max_length_source": "flag" if config.max_length else ("server" if max_length else None),
            "baseline_round_trip": client.baseline_latency_ms()}


def tulip_server(config: BenchConfig, client: Any) -> dict[str, Any]:
    """One Tulip's Info (model, max length, batch limits, device) and a trivial Info round trip; raises
    StackError when it cannot be reached."""
    info = client.info()
    max_length = config.max_length or int(info.get("max_length") or 0) or None
    return {"info": info, "call": client.call, "max_length": max_length,
            "max_length_source": "flag" if config.max_length else ("server" if max_length else None),
            "baseline_round_trip": client.baseline_latency_ms()}


def verification(config: BenchConfig, face: Any, skip_reason: str | None = None) -> dict[str, Any]:
    """verify() against --reference through `face` (a StackClient or an IdsFace); raises
    VerificationError (and the client's errors). Skipped when asked, or with `skip_reason`."""
    if config.skip_verify:
        return {"skipped": True}
    if config.reference is None or skip_reason:
        return {"skipped": True, "reason": skip_reason or "no --reference"}
    return verify(face, Path(config.reference), config.verify_tolerance)
