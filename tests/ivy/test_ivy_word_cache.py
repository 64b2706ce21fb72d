"""The gateway's word cache (rose/word_cache.py): answers equal to those without it, however churned by texts of
words never seen (tests/RELIABILITY.md, case 42), its size bounded, and its counts on /metrics."""

from __future__ import annotations

import random
import string

from fake_tulip import FakeTulip
from ivy_testkit import gateway


def _metric(client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def test_the_gateway_counts_words_looked_up_and_new_ones() -> None:
    with FakeTulip() as fake, gateway(fake) as client:
        words0, new0 = _metric(client, "ivy_tokenizer_words_total"), _metric(client, "ivy_tokenizer_new_words_total")
        for _ in range(2):
            assert client.post("/v1/embeddings", json={"input": "zebra quagga zebra okapi"}).status_code == 200
        assert _metric(client, "ivy_tokenizer_words_total") - words0 == 8
        assert _metric(client, "ivy_tokenizer_new_words_total") - new0 == 3  # the first request's, once each
    with FakeTulip() as fake, gateway(fake, tokenizer_cache_words=0) as client:
        words0 = _metric(client, "ivy_tokenizer_words_total")
        assert client.post("/v1/embeddings", json={"input": "zebra quagga"}).status_code == 200
        assert _metric(client, "ivy_tokenizer_words_total") == words0  # no cache, nothing counted


def test_texts_of_new_words_only_get_the_same_answers_and_the_cache_stays_bounded() -> None:
    rng = random.Random(7)
    alphabet = string.ascii_letters + string.digits + ".,;:!?'-()[]"

    def text() -> str:
        return " ".join("".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
                        for _ in range(rng.randrange(1, 60)))

    bodies = [{"input": [text() for _ in range(rng.randrange(1, 8))]} for _ in range(40)]
    with FakeTulip() as fake:
        with gateway(fake, tokenizer_cache_words=0, truncate=True) as plain:
            want = [plain.post("/v1/embeddings", json=b).json() for b in bodies]
        with gateway(fake, tokenizer_cache_words=16, truncate=True) as client:
            got = [client.post("/v1/embeddings", json=b).json() for b in bodies]
            cache = client.app.state.gateway.tokenizer.word_cache
            assert cache is not None and len(cache) <= 16 and cache.new > 1000
    assert all("data" in w for w in want), want[0]
    assert got == want
