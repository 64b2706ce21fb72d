"""RELIABILITY 3: a list over --max-inputs-per-request (or --max-chunks-per-request) is refused by its count before
its items are validated one by one. A 2 MB body of 500 k one-id lists was parsed and checked item by item on the
event loop (~0.5 s, every other client of the worker stalled) before the count refused it. So the count's error comes
first whatever follows in the list: the same 422 with a bad element at the end as without it."""

from __future__ import annotations

import pytest

from fake_tulip import FakeTulip
from ivy_testkit import gateway

LIMIT, CHUNKS = 8, 16
OVER = LIMIT + 1


def _bodies() -> list[tuple[str, dict, str, str, int]]:
    """(route, body over the limit, the field holding the list, the param the error names, the limit named)."""
    return [
        ("/v1/embeddings", {"input": [[1]] * OVER}, "input", "input", LIMIT),
        ("/v1/embeddings", {"input": ["a"] * OVER}, "input", "input", LIMIT),
        ("/embed", {"inputs": ["a"] * OVER}, "inputs", "inputs", LIMIT),
        ("/pooling", {"input": [[1]] * OVER}, "input", "input", LIMIT),
        ("/decode", {"ids": [[1]] * OVER}, "ids", "ids", LIMIT),
        ("/v1/contextualizedembeddings", {"input": [["a"]] * OVER}, "input", "input", LIMIT),
        ("/v1/contextualizedembeddings", {"input": [["a"] * (CHUNKS + 1)]}, "input", "input chunks", CHUNKS),
        ("/v1/rerank", {"query": "q", "documents": ["a"] * OVER}, "documents", "documents", LIMIT),
        ("/rerank", {"query": "q", "texts": ["a"] * OVER}, "texts", "texts", LIMIT),
        ("/v1/score", {"text_1": "q", "text_2": ["a"] * OVER}, "text_2", "text_2", LIMIT),
        ("/similarity", {"inputs": {"source_sentence": "q", "sentences": ["a"] * LIMIT}}, "sentences",
         "inputs.sentences", LIMIT - 1),
    ]


def _append_bad(body: dict, field: str) -> dict:
    """The same body with an element of the wrong type at the end of its list (inside the last document's chunks
    for a list of documents)."""
    holder = body["inputs"] if field == "sentences" else body
    items = list(holder[field])
    if isinstance(items[-1], list) and items[-1] and isinstance(items[-1][0], str):
        items[-1] = [*items[-1], 5]  # a chunk that is not a string
    else:
        items.append(["x"] if isinstance(items[0], list) else 5)
    bad = {**holder, field: items}
    return {**body, "inputs": bad} if field == "sentences" else bad


@pytest.mark.parametrize("route, body, field, param, limit", _bodies())
def test_the_count_is_refused_before_any_item_is_checked(route, body, field, param, limit) -> None:
    with FakeTulip() as fake, gateway(fake, max_inputs_per_request=LIMIT, max_chunks_per_request=CHUNKS) as client:
        plain = client.post(route, json=body)
        error = plain.json()["error"]
        assert plain.status_code == 422 and error["code"] == "too_many_inputs", plain.text
        assert error["param"] == param and f"at most {limit} " in error["message"], error
        bad = client.post(route, json=_append_bad(body, field))
        assert bad.status_code == 422 and bad.json()["error"]["code"] == "too_many_inputs", bad.text
        assert fake.calls == []
