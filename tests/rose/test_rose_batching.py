"""Ragged batches: batch invariance, span pooling (late chunking), bucket padding, batch validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import FAMILIES
from rose_parity import cosine, hf_hidden, random_seqs

from rose import Batch
from rose.meta import BatchError, ForwardMeta, MetaLayout, pack_batch


@pytest.mark.parametrize("name", FAMILIES)
def test_a_sequence_embeds_the_same_alone_and_packed(name, tiny_models, engine_for):
    tiny, engine = tiny_models[name], engine_for(name)
    target, *others = random_seqs(tiny, [13, 1, 40, 5, 27], seed=21)
    alone = engine.embed([target])[0]
    for packed in ([others[0], target, others[1]], [*others, target], [target, *others]):
        row = engine.embed(packed)[packed.index(target)]
        assert np.allclose(row, alone, atol=1e-5, rtol=1e-4), name


def _hand_span_means(tiny, seqs, spans):
    hidden = hf_hidden(tiny, seqs)
    return np.stack([hidden[s][a:b].mean(0) for s, a, b in spans])


@pytest.mark.parametrize("name", ["bert", "qwen3", "pplx-qwen3"])
def test_span_pooling_equals_mean_of_the_same_tokens(name, tiny_models, engine_for):
    tiny, engine = tiny_models[name], engine_for(name)
    seqs = random_seqs(tiny, [30, 9], seed=4)
    spans = [(0, 0, 1), (0, 1, 11), (0, 11, 30), (1, 2, 9), (1, 0, 2)]  # any order, gaps allowed
    native = engine.step(Batch.from_sequences(seqs, spans=spans)).result()
    expected = _hand_span_means(tiny, seqs, spans)
    if tiny.native_int8:
        expected = np.round(127.0 * np.tanh(expected))
        assert np.abs(native - expected).max() <= 1.0
    else:
        assert np.allclose(native, expected, atol=1e-5, rtol=1e-4)
    assert cosine(native, expected).min() >= 0.9999


def test_late_chunking_on_a_contextual_pplx_folder(tiny_pplx_context):
    """pplx-embed-context: a document's chunks in one sequence, one row per chunk span."""
    from rose.engine import Engine

    engine = Engine.from_pretrained(tiny_pplx_context.path, device="cpu")
    assert engine.spec.is_contextual
    doc = random_seqs(tiny_pplx_context, [40], seed=8)[0]
    chunks = [(0, 0, 12), (0, 12, 25), (0, 25, 40)]
    rows = engine.embed([doc], spans=chunks)
    expected = np.round(127.0 * np.tanh(_hand_span_means(tiny_pplx_context, [doc], chunks)))
    assert rows.shape == (3, 64) and np.abs(rows - expected).max() <= 1.0
    engine.close()


@pytest.mark.parametrize("name", ["bert", "xlm-roberta", "qwen3", "pplx-qwen3"])
@pytest.mark.parametrize("masked", [False, True], ids=["per-sequence", "block-mask"])
def test_bucket_padding_does_not_change_rows(name, masked, engine_for, tiny_models):
    """Padded to a (Tb, Sb, Pb) bucket as a CUDA graph would run it: the real rows are unchanged. The
    block-mask variant is the graph-safe SDPA path CUDA uses, run here on the CPU."""
    engine = engine_for(name)
    runner = engine.runner
    seqs = random_seqs(tiny_models[name], [6, 17, 3], seed=2)
    batch = Batch.from_sequences(seqs, engine.spec.pooling)
    exact = engine.step(batch).result()
    host = runner.pack(batch, MetaLayout(tokens=40, seqs=6, rows=5))
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, max_seqlen=40,
                                   host=None if masked else host)
    with torch.inference_mode():
        out = runner.forward(meta)
    assert out.shape == (5, 64) and torch.isfinite(out).all()
    assert np.allclose(out[:3].numpy(), exact, atol=1e-5, rtol=1e-4)


def test_pack_batch_layout():
    batch = Batch.from_sequences([[5, 6, 7], [8, 9]], spans=[(0, 1, 3), (1, 0, 2)])
    host = pack_batch(batch, MetaLayout(tokens=8, seqs=4, rows=3), pad_id=0)
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen, host)
    assert meta.input_ids.tolist() == [5, 6, 7, 8, 9, 0, 0, 0]
    assert meta.positions.tolist() == [0, 1, 2, 0, 1, 0, 0, 0]
    assert meta.seq_ids.tolist() == [0, 0, 0, 1, 1, 2, 2, 2]  # padding is its own pseudo-sequence
    assert meta.cu_seqlens.tolist() == [0, 3, 5, 8, 8] and meta.cu_seqlens.dtype == torch.int32
    assert meta.span_index.tolist() == [3, 0, 0, 1, 1, 3, 3, 3]  # 3 = dummy row Pb
    assert meta.span_count.tolist() == [2.0, 2.0, 1.0] and meta.span_count.dtype == torch.float32
    assert host.max_seqlen == 3


def test_bad_spans_are_rejected(engine_for):
    engine = engine_for("bert")
    with pytest.raises(BatchError, match="overlap"):
        engine.embed([[5, 6, 7, 8], [9, 10]], spans=[(0, 0, 3), (0, 2, 4)])
    with pytest.raises(ValueError, match="outside"):
        engine.embed([[5, 6, 7, 8], [9, 10]], spans=[(0, 0, 6)])


def test_overlapping_and_crossing_absolute_spans_are_rejected():
    ids, lens = np.arange(6, dtype=np.int32), np.array([4, 2], dtype=np.int32)
    with pytest.raises(BatchError, match="overlap"):
        pack_batch(Batch(ids, lens, np.array([[0, 3], [1, 2]], dtype=np.int32)))
    with pytest.raises(BatchError, match="crosses"):
        pack_batch(Batch(ids, lens, np.array([[2, 5]], dtype=np.int32)))


def test_token_ids_and_lengths_are_checked_before_the_device(engine_for):
    engine = engine_for("bert")
    with pytest.raises(BatchError, match="outside the vocabulary"):
        engine.embed([[1, 2, 256]])
    with pytest.raises(BatchError, match="at most 64"):
        engine.embed([[5] * 65])
    assert engine.stats()["pinned_bytes_in_use"] == 0


def test_embed_chunks_large_inputs_and_keeps_order(engine_for, tiny_models, monkeypatch):
    import rose.engine

    engine = engine_for("qwen3")
    seqs = random_seqs(tiny_models["qwen3"], [30, 5, 60, 12, 44, 2], seed=6)
    spans = [(2, 0, 10), (0, 3, 30), (5, 0, 2), (2, 10, 60)]
    whole, whole_spans = engine.embed(seqs), engine.embed(seqs, spans=spans)
    monkeypatch.setattr(rose.engine, "EMBED_CHUNK_TOKENS", 50)
    assert np.allclose(engine.embed(seqs), whole, atol=1e-5)
    assert np.allclose(engine.embed(seqs, spans=spans), whole_spans, atol=1e-5)
    assert engine.embed([]).shape == (0, 64)


def test_the_one_row_per_sequence_shortcut_packs_as_the_general_rule():
    """rose.meta._span_index's shortcut (one span per sequence, whole or one token, each inside its own
    sequence) gives the general rule's rows, and everything else (shuffled, several spans a sequence, a span
    outside its sequence) still takes the general rule, with its errors."""
    from rose.meta import _span_index

    rng = np.random.default_rng(7)
    shortcut = 0
    for trial in range(400):
        lens = rng.integers(1, 9, size=int(rng.integers(1, 6))).astype(np.int32)
        cu = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
        kind = trial % 5
        if kind == 0:  # mean: each sequence whole
            spans = np.stack([cu[:-1], cu[1:]], 1)
        elif kind in (1, 2):  # CLS or last token, or any one token of each sequence
            pick = cu[:-1] if kind == 1 else cu[:-1] + rng.integers(0, lens)
            spans = np.stack([pick, pick + 1], 1)
        elif kind == 3:  # the same rows, shuffled: the general rule's order
            spans = np.stack([cu[:-1], cu[1:]], 1)[rng.permutation(len(lens))]
        else:  # random spans anywhere, often invalid
            a = rng.integers(0, cu[-1], size=len(lens))
            spans = np.stack([a, a + rng.integers(0, 4, size=len(lens))], 1)
        spans = spans.astype(np.int32)
        seq_ids = np.repeat(np.arange(len(lens), dtype=np.int64), lens)
        layout = MetaLayout(int(cu[-1]) + 3, len(lens) + 1, len(lens) + 1)
        results = []
        for with_cu in (None, cu):
            try:
                results.append(_span_index(spans, seq_ids, int(cu[-1]), layout, with_cu))
            except BatchError as exc:
                results.append(type(exc))
        general, fast = results
        if isinstance(general, np.ndarray):
            assert isinstance(fast, np.ndarray) and np.array_equal(general, fast), (lens, spans)
            shortcut += kind in (0, 1, 2)
        else:
            assert fast is general, (lens, spans)
    assert shortcut >= 200  # the shortcut's cases were met, and agree


def test_one_sequence_packs_as_the_general_rule():
    """pack_batch's lone-query path (rose.meta._pack_one: one sequence, one row, no token types) writes the
    same packed words and HostMeta as the general rule, at exact sizes and in larger bucket layouts, for a
    whole, first-token, last-token or inner span; a span outside the sequence is refused by both alike."""
    from rose.meta import _pack_general, _pack_one

    rng = np.random.default_rng(11)
    for trial in range(300):
        t = int(rng.integers(1, 40))
        ids = rng.integers(0, 1000, t).astype(np.int32)
        kind = trial % 5
        start, end = [(0, t), (0, 1), (t - 1, t), (int(rng.integers(0, t)), None), (int(rng.integers(-1, t + 1)), None)][kind]
        if end is None:
            end = int(rng.integers(start + (kind == 3), t + 2 if kind == 4 else t + 1))
        batch = Batch(token_ids=ids, seq_lens=np.array([t], np.int32), spans=np.array([[start, end]], np.int32))
        layout = [None, MetaLayout(t, 1, 1), MetaLayout(t + int(rng.integers(1, 9)), 2, int(rng.integers(1, 4)),
                                                     int(rng.integers(0, 50)))][trial % 3] or MetaLayout(t, 1, 1)
        results = []
        for pack, extra in ((_pack_general, (t,)), (_pack_one, ())):
            try:
                results.append(pack(batch, layout, 7, *extra))
            except BatchError as exc:
                results.append(type(exc))
        general, fast = results
        if isinstance(general, type):
            assert fast is general, (t, start, end)
            continue
        assert np.array_equal(general.packed, fast.packed), (t, start, end, layout)
        assert np.array_equal(general.cu_seqlens, fast.cu_seqlens)
        assert (general.num_tokens, general.num_seqs, general.num_rows, general.max_seqlen, general.layout) == \
            (fast.num_tokens, fast.num_seqs, fast.num_rows, fast.max_seqlen, fast.layout)


def test_lone_sequences_of_one_shape_share_only_their_fixed_words():
    """_pack_one copies the words its (layout, length, span) key shares (rose.meta._lone_words) and writes its own
    ids: two batches of one key each get their own ids, the shared words stay unwritten, and a layout past
    LONE_WORDS_TOKENS is packed without being kept."""
    from rose import meta

    layout = MetaLayout(16, 2, 2)
    first, second = (Batch.from_sequences([np.full(10, v, np.int32)]) for v in (5, 9))
    meta._lone_words.cache_clear()
    a, b = pack_batch(first, layout), pack_batch(second, layout)
    assert meta._lone_words.cache_info().hits == 1
    assert (a.packed[:10] == 5).all() and (b.packed[:10] == 9).all()
    assert a.packed.flags.writeable and not np.shares_memory(a.packed, b.packed)
    shared, _ = meta._lone_words(layout, 10, 0, 10, 0)
    assert (shared[:10] == 0).all() and not shared.flags.writeable
    kept = meta._lone_words.cache_info().currsize
    big = MetaLayout(meta.LONE_WORDS_TOKENS * 2, 2, 2)
    lone = Batch.from_sequences([np.arange(1, 41, dtype=np.int32)])
    packed = pack_batch(lone, big)
    assert meta._lone_words.cache_info().currsize == kept
    general = meta._pack_general(lone, big, 0, 40)
    assert np.array_equal(packed.packed, general.packed) and np.array_equal(packed.cu_seqlens, general.cu_seqlens)


def test_negative_token_ids_and_types_are_refused_like_ids_past_the_vocabulary():
    """pack_batch checks ids and token types through one unsigned max each: a negative value is refused too."""
    with pytest.raises(BatchError, match="token id -3 is outside the vocabulary"):
        pack_batch(Batch.from_sequences([np.array([4, -3, 2], np.int32)]), vocab_size=100)
    with pytest.raises(BatchError, match="token id 100 is outside"):
        pack_batch(Batch.from_sequences([np.array([4, 100], np.int32)]), vocab_size=100)
    ids, lens = np.array([1, 2], np.int32), np.array([2], np.int32)
    spans = np.array([[0, 2]], np.int32)
    with pytest.raises(BatchError, match="token types"):
        pack_batch(Batch(ids, lens, spans, np.array([0, -1], np.int32)), vocab_size=10, type_vocab_size=2)
    assert pack_batch(Batch(ids, lens, spans, np.array([0, 1], np.int32)), vocab_size=10,
                      type_vocab_size=2).num_tokens == 2
