"""Benchmark inputs: real text, exact token counts with a tokenizer, lognormal lengths, deterministic."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from benchmarks.stack.client import Sample
from benchmarks.stack.corpus import WORDS_PER_TOKEN, Corpus, DocumentMaker, TokenCounter, documents, lognormal_lengths
from benchmarks.stack.report import CostBasis, summarize


@pytest.fixture(scope="module")
def counter(minilm_dir: Path) -> TokenCounter:
    return TokenCounter(minilm_dir)


@pytest.mark.parametrize("n_tokens", [3, 16, 128, 512, 4096])
def test_documents_have_exactly_the_requested_tokens(counter: TokenCounter, n_tokens: int) -> None:
    maker = DocumentMaker(Corpus.load(), counter)
    rng = random.Random(n_tokens)
    for _ in range(5):
        text = maker.document(rng, n_tokens)
        assert counter.count(text) == n_tokens
        assert len(set(text.split())) > min(3, n_tokens // 4), "real text, not a repeated token"


def test_tokenizer_json_truncation_is_switched_off(counter: TokenCounter) -> None:
    # the bundled tokenizer.json truncates at 128 and pads to 128: counts must ignore both
    assert counter.special == 2
    assert counter.count("hello") == 3


def test_same_seed_same_documents(minilm_dir: Path) -> None:
    first = documents(minilm_dir, 20, seed=7)
    assert first == documents(minilm_dir, 20, seed=7)
    assert first != documents(minilm_dir, 20, seed=8)


def test_lognormal_lengths_follow_the_parameters() -> None:
    lengths = lognormal_lengths(random.Random(0), 4000, np.log(128), 0.8, 16, 512)
    assert min(lengths) >= 16 and max(lengths) <= 512
    assert 110 <= np.median(lengths) <= 150
    assert lengths.count(512) > 0 and lengths.count(16) > 0  # both clips are reached at this sigma


def test_without_a_tokenizer_lengths_are_approximated_by_words() -> None:
    counter = TokenCounter(None)
    assert not counter.exact and counter.describe()["kind"] == "approximate"
    text = DocumentMaker(Corpus.load(), counter).document(random.Random(1), 200)
    assert len(text.split()) == round(200 * WORDS_PER_TOKEN)


def _sample(start: float, latency: float, ok: bool = True) -> Sample:
    return Sample(start, latency, items=2, tokens=100, tokens_from_usage=True, ok=ok)


def test_summarize_percentiles_rates_and_cost() -> None:
    latencies = [0.001 * (i + 1) for i in range(100)]  # 1..100 ms, back to back
    samples, t = [], 0.0
    for lat in latencies:
        samples.append(_sample(t, lat))
        t += lat
    samples.append(_sample(t, 0.5, ok=False))
    record = summarize("concurrency", 1, samples, CostBasis(3.6, 2))
    assert record["p50_ms"] <= record["p95_ms"] <= record["p99_ms"] <= record["max_ms"]
    assert record["p50_ms"] == pytest.approx(50.5)
    assert record["requests"] == 100 and record["errors"] == 1
    window = sum(latencies) + 0.5
    assert record["rps"] == pytest.approx(100 / window)
    assert record["tokens_per_s"] == pytest.approx(100 * 100 / window)
    # $7.2 an hour = $0.002 a second, over 200 embeddings per window
    assert record["cost_per_million_embeddings_usd"] == pytest.approx(0.002 / (200 / window) * 1e6)


def test_summarize_refuses_when_everything_failed() -> None:
    from benchmarks.stack.client import StackError

    with pytest.raises(StackError, match="all 2 requests failed"):
        summarize("throughput", 100, [_sample(0, 1, ok=False), _sample(1, 1, ok=False)])
