"""Small requests are tokenized on the event loop (no thread hop); large ones in the tokenizer pool."""

from __future__ import annotations

import asyncio
import threading

from ivy.tokenization import InputEncoder
from rose.spec import bundled_model_dir, load_spec
from rose.tokenizer import Tokenizer


def _encoder(inline_chars: int) -> InputEncoder:
    spec = load_spec(bundled_model_dir())
    return InputEncoder(spec, Tokenizer(spec), threads=1, char_cap=100_000, inline_chars=inline_chars)


def _spy(encoder: InputEncoder, method: str) -> set[str]:
    """The names of the threads that will run encoder.<method> (filled as it runs)."""
    seen: set[str] = set()
    real = getattr(encoder, method)

    def spy(*args):
        seen.add(threading.current_thread().name)
        return real(*args)

    setattr(encoder, method, spy)
    return seen


def _threads_used(encoder: InputEncoder, texts: list[str]) -> tuple[set[str], list[list[int]]]:
    seen = _spy(encoder, "_encode_texts")

    async def run():
        return await encoder.encode_texts(texts, truncate=True, side="right")

    try:
        return seen, [ids.tolist() for ids in asyncio.run(run())]
    finally:
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
