"""What every suite needs (`SuiteContext`), and how a suite's texts become the requests one layer sends.

A layer is the client the suites talk to: the gateway with texts or with token ids (`--input`), one Tulip
over gRPC with ids, or ROSE in-process with ids. Whatever the layer, a step's texts come from the same
seeded draws, so every layer gets the very same requests; with ids the client tokenizes them itself with
the model's tokenizer.json (special tokens included, nothing truncated, no prompt prepended: the ids
the gateway would send Tulip for the same text when the model has no default prompt).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from benchmarks.stack.client import Sample
from benchmarks.stack.config import BenchConfig
from benchmarks.stack.corpus import CorpusError, DocumentMaker, TokenCounter, lognormal_lengths
from benchmarks.stack.load import Budget, ClientSpec, Request
from benchmarks.stack.report import CostBasis
from benchmarks.stack.server_counters import scrape

INPUTS = ("text", "ids")
# A replay of the multi-client suites in this process (the in-process layer: one engine, no client
# processes): (suite, requests per client, budget) -> samples.
Replay = Callable[[str, list[list[Request]], Budget], list[Sample]]


class IdTokenizer:
    """Texts -> token ids with the same tokenizer.json, settings and special tokens as `TokenCounter`."""

    def __init__(self, counter: TokenCounter) -> None:
        if not counter.exact or counter.model_dir is None:
            raise CorpusError("token-id input needs --tokenizer (the model folder or its tokenizer.json)")
        from tokenizers import Tokenizer

        path = counter.model_dir / "tokenizer.json" if counter.model_dir.is_dir() else counter.model_dir
        self._tok = Tokenizer.from_file(str(Path(path)))
        self._tok.no_truncation()
        self._tok.no_padding()

    def __call__(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        return [tuple(e.ids) for e in self._tok.encode_batch(list(texts))]


@dataclass
class SuiteContext:
    """What every suite needs; `skipped` and `inputs` are filled while suites run. `client` and `spec`
    are a layer's (StackClient / ClientSpec, or their Tulip and in-process counterparts)."""

    config: BenchConfig
    client: Any
    spec: ClientSpec | Any
    maker: DocumentMaker
    max_length: int | None
    cost: CostBasis
    skipped: list[dict[str, Any]] = field(default_factory=list)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    replay: Replay | None = None
    tokenize: IdTokenizer | None = None

    def __post_init__(self) -> None:
        if self.config.input not in INPUTS:
            raise ValueError(f"--input must be one of {', '.join(INPUTS)}, not {self.config.input!r}")
        if self.config.input == "ids" and self.tokenize is None:
            self.tokenize = IdTokenizer(self.maker.counter)

    def request(self, texts: Sequence[str], tokens: int, query: str | None = None) -> Request:
        """A request of `texts` (scored against `query` when given), as this layer sends it."""
        if self.config.input != "ids":
            return Request(tuple(texts), tokens, query)
        assert self.tokenize is not None
        ids = self.tokenize([query, *texts] if query is not None else list(texts))
        return Request(tuple(texts), tokens, query, ids=tuple(ids))

    def server_counters(self) -> dict[str, float] | None:
        """The server's counters now (--server-metrics), or None when not asked for or unreachable."""
        urls = [u.strip() for u in (self.config.server_metrics or "").split(",") if u.strip()]
        if not urls:
            return None
        try:
            return scrape(urls)
        except (OSError, ValueError) as exc:
            print(f"  server metrics unreadable ({type(exc).__name__}: {exc}); records go without", file=sys.stderr)
            return None

    def rng(self, *key: object) -> random.Random:
        return random.Random(":".join(map(str, (self.config.seed, *key))))  # str seeds are stable

    @property
    def budget(self) -> Budget:
        c = self.config
        return Budget(c.duration_s, c.requests, c.warmup_requests)

    def too_long(self, suite: str, param: int, tokens: int) -> bool:
        if self.max_length is not None and tokens > self.max_length:
            self.skip(suite, param, f"{tokens} tokens is over the server's max length {self.max_length}")
            return True
        return False

    def skip(self, suite: str, param: int, reason: str) -> None:
        self.skipped.append({"suite": suite, "param": param, "reason": reason})
        print(f"  [{suite} {param}] skipped: {reason}", file=sys.stderr, flush=True)

    def keep(self, suite: str, param: int, requests: list[Request] | list[list[Request]]) -> None:
        if self.config.dump_inputs:
            self.inputs.setdefault(suite, {})[str(param)] = _as_json(requests)

    def doc_range(self) -> tuple[int, int]:
        hi = self.config.doc_max_tokens
        if self.max_length is not None:
            hi = min(hi, self.max_length)
        return min(self.config.doc_min_tokens, hi), hi

    def lognormal_docs(self, rng: random.Random, count: int) -> list[tuple[str, int]]:
        lo, hi = self.doc_range()
        lengths = lognormal_lengths(rng, count, self.config.doc_mu, self.config.doc_sigma, lo, hi)
        return list(zip(self.maker.documents(rng, lengths), lengths, strict=True))


def _as_json(requests: list[Any]) -> list[Any]:
    if requests and isinstance(requests[0], list):
        return [_as_json(r) for r in requests]
    return [{"texts": list(r.texts), "tokens": r.tokens, **({"query": r.query} if r.query else {})}
            for r in requests]
