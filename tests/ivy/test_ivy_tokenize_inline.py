"""Small requests are tokenized on the event loop (no thread hop); large ones in the tokenizer pool, unless the word
cache takes them whole and knows nearly all their words (then on the loop too: that work holds the GIL anyway)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from ivy.errors import IvyError
from ivy.tokenization import InputEncoder
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer


def _encoder(inline_chars: int, warm_inline: bool = False, model_dir=None, **kwargs) -> InputEncoder:
    spec = load_spec(model_dir or bundled_model_dir())
    return InputEncoder(spec, Tokenizer(spec, **kwargs), threads=1, char_cap=100_000, inline_chars=inline_chars,
                        warm_inline=warm_inline)


def _spy(encoder: InputEncoder, method: str, answers: list | None = None) -> set[str]:
    """The names of the threads that will run encoder.<method> (filled as it runs); `answers`: what it returned."""
    seen: set[str] = set()
    real = getattr(encoder, method)

    def spy(*args):
        seen.add(threading.current_thread().name)
        out = real(*args)
        if answers is not None:
            answers.append(out)
        return out

    setattr(encoder, method, spy)
    return seen


def _threads_used(encoder: InputEncoder, texts: list[str], close: bool = True) -> tuple[set[str], list[list[int]]]:
    seen = _spy(encoder, "_encode_texts")

    async def run():
        return await encoder.encode_texts(texts, truncate=True, side="right")

    try:
        return seen, [ids.tolist() for ids in asyncio.run(run())]
    finally:
        if close:
            encoder.close()


def test_small_request_runs_on_the_loop_and_large_in_the_pool() -> None:
    loop_thread = threading.current_thread().name  # asyncio.run drives the loop on this thread
    small, small_ids = _threads_used(_encoder(inline_chars=100), ["hello world"])
    assert small == {loop_thread}
    large, large_ids = _threads_used(_encoder(inline_chars=100), ["hello world " * 20])
    assert large and loop_thread not in large and all(n.startswith("ivy-tokenize") for n in large)
    # the same ids whichever way it ran
    assert _threads_used(_encoder(inline_chars=0), ["hello world"])[1] == small_ids
    assert _threads_used(_encoder(inline_chars=10_000), ["hello world " * 20])[1] == large_ids


def test_zero_means_always_the_pool() -> None:
    used, _ = _threads_used(_encoder(inline_chars=0), ["hi"])
    assert all(n.startswith("ivy-tokenize") for n in used)


def test_token_ids_are_checked_on_the_loop_whatever_their_size() -> None:
    """Reading Python ints into an array holds the GIL: a pool thread would add hand-offs and free nothing."""
    encoder = _encoder(inline_chars=0)
    seen = _spy(encoder, "_check_ids")
    ids = [[101] + [2000] * 200 + [102]] * 20
    try:
        checked = asyncio.run(encoder.check_ids(ids, truncate=True, side="right"))
        assert [c.tolist() for c in checked] == [[101] + [2000] * 200 + [102]] * 20
    finally:
        encoder.close()
    assert seen == {threading.current_thread().name}


WARM = "the server embeds the query and the documents it was sent, then answers with their vectors. " * 40


def test_a_large_text_the_word_cache_knows_is_encoded_on_the_loop_with_the_pools_ids() -> None:
    loop_thread = threading.current_thread().name
    pooled = _threads_used(_encoder(inline_chars=100), [WARM, WARM[:999]])[1]
    encoder = _encoder(inline_chars=100, warm_inline=True)
    warm_seen = _spy(encoder, "_encode_warm")
    used, ids = _threads_used(encoder, [WARM, WARM[:999]])
    assert warm_seen == {loop_thread} and not used  # the pool's job never ran
    assert ids == pooled


def test_a_large_text_of_many_new_words_still_goes_to_the_pool_and_learns_there() -> None:
    loop_thread = threading.current_thread().name
    fresh = " ".join(f"w{i:04x}q" for i in range(300))  # 300 words the cache has never seen
    encoder = _encoder(inline_chars=100, warm_inline=True)
    words = encoder.tokenizer.word_cache
    before = len(words)
    answers: list = []
    warm_seen = _spy(encoder, "_encode_warm", answers)
    learned_on_loop = []
    words.observe = lambda n, new: learned_on_loop.append(new) if threading.current_thread().name == loop_thread \
        else None
    used, ids = _threads_used(encoder, [fresh])
    assert warm_seen == {loop_thread} and answers == [None], "tried on the loop, declined"
    assert used and loop_thread not in used
    assert ids == _threads_used(_encoder(inline_chars=0), [fresh])[1]
    assert len(words) > before and not learned_on_loop  # learned in the pool, not on the loop


def test_non_ascii_and_over_the_cache_call_bound_go_to_the_pool() -> None:
    loop_thread = threading.current_thread().name
    for texts, kwargs in (([WARM + " café"], {}), ([WARM], {"cache_call_chars": 1000})):
        encoder = _encoder(inline_chars=100, warm_inline=True, **kwargs)
        _threads_used(encoder, [WARM[:500]], close=False)  # every word learned
        used, _ = _threads_used(encoder, texts)
        assert used and loop_thread not in used, kwargs


def test_the_warm_path_refuses_an_over_long_text_as_the_pool_does() -> None:
    long_warm = WARM * 3  # over the bundled model's 256 (or 512) tokens
    messages = []
    for warm in (False, True):
        encoder = _encoder(inline_chars=100, warm_inline=warm)
        asyncio.run(encoder.encode_texts([WARM], truncate=True, side="right"))  # every word learned
        pooled = _spy(encoder, "_encode_texts")
        with pytest.raises(IvyError) as err:
            asyncio.run(encoder.encode_texts(["hi", long_warm], truncate=False, side="right"))
        encoder.close()
        assert bool(pooled) != warm, "the warm path answered (with its 422) without the pool"
        assert err.value.param == "input[1]" and "tokens" in str(err.value)
        messages.append(str(err.value))
    assert messages[0] == messages[1]


def test_the_warm_path_keeps_prompt_truncation_side_and_max_tokens() -> None:
    out = []
    for warm in (False, True):
        encoder = _encoder(inline_chars=100, warm_inline=warm)
        asyncio.run(encoder.encode_texts([WARM], truncate=True, side="right"))  # every word learned
        pooled = _spy(encoder, "_encode_texts")
        for side in ("left", "right"):
            ids = asyncio.run(encoder.encode_texts([WARM, WARM[:300]], truncate=True, side=side,
                                                   prompt="query: the ", max_tokens=40))
            out.append([x.tolist() for x in ids])
        encoder.close()
        assert bool(pooled) != warm
    assert out[:2] == out[2:] and out[0] != out[1] and all(len(x) == 40 for x in out[0])


def test_a_request_waiting_for_a_busy_pool_is_answered_at_its_deadline(fake) -> None:
    """RELIABILITY 14: a request whose texts wait for the tokenizer threads (busy with others' long texts) is
    answered 504 at its deadline, not when the threads come free, and its tokenizing is dropped from the queue."""
    from ivy_testkit import gateway

    with gateway(fake, tokenizer_threads=1, tokenize_inline_chars=0, tokenize_warm_inline=False) as client:
        encoder = client.app.state.gateway.encoder
        ran: list = []
        _spy(encoder, "_encode_texts", ran)
        release = threading.Event()
        busy = encoder._pool.submit(release.wait, 30)  # the one thread taken by another request's work
        try:
            start = time.monotonic()
            r = client.post("/v1/embeddings", json={"input": ["hello world"] * 4}, headers={"X-Request-Timeout": "0.3"})
            took = time.monotonic() - start
            assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded", r.text
            assert took < 2.0, f"answered after {took:.2f} s for a 0.3 s deadline"
        finally:
            release.set()
        busy.result(10)
        ok = client.post("/v1/embeddings", json={"input": ["hello world"] * 4})
        assert ok.status_code == 200, ok.text
        assert len(ran) == 1 and len(fake.calls) == 1  # the late request's texts were never tokenized nor sent
