"""The persistent decoder (rose.layers.persistent_decoder) on the GPU, at the Qwen3-0.6B's layer shape (three
layers, random bf16): as close to the layer-by-layer kernels as bf16 allows on single, ragged and padded
batches (one packed at a graph's padded layout), causal and not; the barriers' kernel the same bits as the
phases launched one by one and on every call; the same under CUDA-graph capture and replay; attach's
routing through Qwen3Model.forward; the kernel's own clock; weights prefetched into L2 and the barrier's fence and
counter forms changing no bits; a grid that cannot all be resident ending stalled in NaN rows with each barrier
form; attention computing its own heads (no heads step) as close to the layers. BERT-style
encoders at all-MiniLM's shape and bert-large's against their layers, and through the engine against transformers."""

from __future__ import annotations

import pytest
import torch

from rose.layers import persistent_attach, persistent_decoder
from rose.layers.persistent_decoder import PersistentDecoder

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available() or persistent_decoder.triton is None,
                                                  reason="needs CUDA and Triton")]

BATCHES = {"one-128": [128], "one-1": [1], "ragged": [5, 60, 3, 17], "eight-16": [16] * 8, "odd-77": [77],
           "padded-64": [20, 9]}  # "padded-64": packed at a graph's layout of 64 tokens (a padding pseudo-sequence)


def _setup(causal: bool, lens: list[int]):
    from benchmarks.persistent_decoder import device_meta, random_qwen3
    from rose.attention import make_backend
    from rose.attention.shape import AttentionShape

    model = random_qwen3(causal=causal, layers=3, seed=len(lens))
    attn = model.layers[0].self_attn
    shape = AttentionShape(attn.num_heads, attn.num_kv_heads, attn.head_dim, causal=causal)
    backend = make_backend("triton", torch.device("cuda"), torch.bfloat16, shape=shape)
    from rose.meta import MetaLayout

    layout = MetaLayout(tokens=64, seqs=4, rows=4) if lens == BATCHES["padded-64"] else None
    return model, backend, device_meta(lens, 1000, seed=sum(lens), layout=layout)


def _cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_matches_the_layer_by_layer_kernels(causal, batch):
    model, backend, meta = _setup(causal, BATCHES[batch])
    with torch.inference_mode():
        expected = model(meta, backend)
        decoder = PersistentDecoder(model)
        embedded = model.embed_tokens(meta.input_ids)
        got = decoder(embedded, meta.positions, meta.seq_ids)
        launched = decoder(embedded, meta.positions, meta.seq_ids, persistent=False)
        again = [decoder(embedded, meta.positions, meta.seq_ids) for _ in range(5)]
    torch.cuda.synchronize()
    err = ((got.float() - expected.float()).norm() / expected.float().norm()).item()
    assert err < 2e-2, err
    assert _cosines(got, expected).min().item() > 0.999
    assert torch.equal(got, launched)
    assert all(torch.equal(got, a) for a in again)


@pytest.mark.parametrize("batch", ["one-1", "ragged"])
def test_the_other_forms_match_too(batch):
    """Attention computing its own heads (no heads step) matches the layers as the default does; the barrier's
    forms change no bits against each other (the default, counter, against fence, acquire, and the counter form
    reading the stall word every 64th poll)."""
    import dataclasses

    model, backend, meta = _setup(True, BATCHES[batch])
    decoder = PersistentDecoder(model)
    with torch.inference_mode():
        expected = model(meta, backend)
        embedded = model.embed_tokens(meta.input_ids)
        plain = decoder(embedded, meta.positions, meta.seq_ids).clone()
        fitted = decoder.tiles
        own = decoder.tiles_at(embedded.shape[0])  # the block's own tiles, only the barrier's form changed
        decoder.tiles = dataclasses.replace(own, barrier="fence" if own.barrier != "fence" else "acquire")
        fenced = decoder(embedded, meta.positions, meta.seq_ids).clone()
        decoder.tiles = dataclasses.replace(own, barrier="counter" if own.barrier != "counter" else "acquire")
        other_form = decoder(embedded, meta.positions, meta.seq_ids).clone()  # counter against acquire
        decoder.tiles = dataclasses.replace(own, barrier="counter", stall_every=64)
        lean = decoder(embedded, meta.positions, meta.seq_ids).clone()
        decoder.tiles = dataclasses.replace(fitted, heads=False, keys=32)  # (the form measured: 3 stages)
        own_heads = decoder(embedded, meta.positions, meta.seq_ids)
    torch.cuda.synchronize()
    assert torch.equal(fenced, plain) and torch.equal(other_form, plain) and torch.equal(lean, plain)
    err = ((own_heads.float() - expected.float()).norm() / expected.float().norm()).item()
    assert err < 2e-2 and _cosines(own_heads, expected).min().item() > 0.999, err


@pytest.mark.parametrize("form, stall_every", [("acquire", 1), ("fence", 1), ("counter", 1), ("counter", 64)])
def test_a_grid_that_cannot_all_be_resident_ends_stalled_in_nan_rows(form, stall_every):
    """Four programs an SM (one fits by registers): the resident ones wait out their bounded spins at the first
    barrier, set the stall word, and every later wait ends at once, so the launch finishes with NaN rows and
    stalled() says so, in each of the barrier's forms (rose.layers.grid_sync), the counter form's also when it reads
    the stall word only every 64th poll."""
    import dataclasses

    model, _, meta = _setup(True, [16])
    decoder = PersistentDecoder(model, programs=4 * torch.cuda.get_device_properties(0).multi_processor_count)
    decoder.tiles = dataclasses.replace(decoder.tiles_at(16), barrier=form, stall_every=stall_every)
    decoder.spins = 1 << 14
    with torch.inference_mode():
        out = decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids)
    torch.cuda.synchronize()
    assert decoder.stalled() and out.isnan().all()


@pytest.mark.parametrize("who", ["own", "idle", "first"])
@pytest.mark.parametrize("tokens", [16, 128])
def test_weights_prefetched_into_l2_change_no_bits(tokens, who):
    import dataclasses

    model, _, meta = _setup(True, [tokens])
    decoder = PersistentDecoder(model)
    with torch.inference_mode():
        embedded = model.embed_tokens(meta.input_ids)
        plain = decoder(embedded, meta.positions, meta.seq_ids).clone()
        decoder.tiles = dataclasses.replace(decoder.tiles_at(tokens), prefetch=who)  # the block's tiles, prefetching
        prefetched = decoder(embedded, meta.positions, meta.seq_ids)
    torch.cuda.synchronize()
    assert torch.equal(prefetched, plain)


def test_graph_replay_equals_eager_and_follows_new_inputs():
    model, _, meta = _setup(True, [100])
    decoder = PersistentDecoder(model)
    with torch.inference_mode():
        ids = meta.input_ids.clone()
        eager = decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids).clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids)
        for _ in range(3):
            graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, eager)
        meta.input_ids.copy_(torch.flip(ids, [0]))
        fresh = decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids).clone()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, fresh) and not torch.equal(out, eager)


def test_attached_it_takes_small_batches_only():
    model, backend, small = _setup(True, [64])
    _, _, large = _setup(True, [200])
    with torch.inference_mode():
        plain_small, plain_large = model(small, backend), model(large, backend)
        assert persistent_attach.attach(model, backend, 128) is model.persistent is not None
        routed_small, routed_large = model(small, backend), model(large, backend)
        direct = model.persistent(model.embed_tokens(small.input_ids), small.positions, small.seq_ids)
    assert torch.equal(routed_small, direct) and not torch.equal(routed_small, plain_small)
    assert torch.equal(routed_large, plain_large)


def test_the_kernels_clock_marks_every_step_in_order():
    model, _, meta = _setup(True, [64])
    decoder = PersistentDecoder(model)
    clock = torch.zeros(decoder.steps(64) + 1, dtype=torch.int64, device="cuda")
    with torch.inference_mode():
        timed = decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids, clock=clock)
        plain = decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids)
    torch.cuda.synchronize()
    steps = clock.diff()
    assert torch.equal(timed, plain) and bool((clock > 0).all()) and bool((steps >= 0).all())
    assert 0 < int(clock[-1] - clock[0]) < 1_000_000_000
    with pytest.raises(ValueError, match="clock"):
        decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids, persistent=False, clock=clock)


def test_every_programs_clock_shows_the_barrier_holding():
    """Every program's clock changes no bits, and reads what the barrier promises: no program starts a step before
    every program has ended the one before; each program's work ends after it starts, in ns and in cycles."""
    from benchmarks.persistent_clock import split_steps

    model, _, meta = _setup(True, [64])
    decoder = PersistentDecoder(model)
    clock = torch.zeros(decoder.steps(64), decoder.programs, 4, dtype=torch.int64, device="cuda")
    with torch.inference_mode():
        timed = decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids, clock=clock)
        plain = decoder(model.embed_tokens(meta.input_ids), meta.positions, meta.seq_ids)
    torch.cuda.synchronize()
    c = clock.cpu()
    assert torch.equal(timed, plain) and bool((c[..., 0] > 0).all())
    assert bool((c[..., 1] >= c[..., 0]).all()) and bool((c[..., 3] > c[..., 2]).all())
    assert bool((c[:-1, :, 1].max(-1).values <= c[1:, :, 0].min(-1).values).all())  # the barrier, step by step
    rate = (c[-1, :, 3] - c[0, :, 2]).double() / (c[-1, :, 1] - c[0, :, 0]).double()  # cycles a ns, each SM
    assert bool(((rate > 0.5) & (rate < 3.0)).all()), rate  # an SM's clock, 0.5-3 GHz: the cycles are its own
    steps = split_steps(c[None])
    gemms = [s for s in range(decoder.steps(64) - 1) if decoder.step_kind(s, 64)[1] in (1, 3, 5, 6)]
    assert bool((steps["work p50"][gemms] > 0.1).all())  # µs: the GEMM phases' work lies between the reads
    assert bool((steps["release"][:-1] >= 0).all()) and 0 < float(steps["step"].sum()) < 1e6  # µs


def _bert_large_widths() -> dict:
    """bert-large's widths (bge-large's, e5-large's) as the benchmarks' model zoo has them, less its depth."""
    from benchmarks.model_zoo import ENCODER_CONFIGS

    return {k: v for k, v in ENCODER_CONFIGS["bert-large"][2].items() if k != "num_hidden_layers"}


@pytest.mark.parametrize("width, batch", [("minilm", "one-128"), ("minilm", "ragged"), ("minilm", "one-1"),
                                          ("minilm", "padded-64"), ("large", "one-128"), ("large", "ragged")])
def test_bert_matches_its_layers(width, batch):
    """All-MiniLM's shape (heads of 32, width 384) and bert-large's (heads of 64, width 1 024, inner 4 096)."""
    import dataclasses

    from benchmarks.persistent_decoder import device_meta, random_bert
    from rose.attention import make_backend
    from rose.attention.shape import AttentionShape
    from rose.meta import MetaLayout

    lens = BATCHES[batch]
    widths = _bert_large_widths() if width == "large" else {}
    model = random_bert(layers=3, seed=len(lens), **widths)
    shape = AttentionShape(16, 16, 64, causal=False) if widths else AttentionShape(12, 12, 32, causal=False)
    backend = make_backend("triton", torch.device("cuda"), torch.bfloat16, shape=shape)
    layout = MetaLayout(tokens=64, seqs=4, rows=4) if batch == "padded-64" else None
    meta = device_meta(lens, 1000, seed=sum(lens), layout=layout)
    with torch.inference_mode():
        expected = model(meta, backend)
        decoder = PersistentDecoder(model)
        embedded = model.embeddings(meta.input_ids, meta.positions)
        got = decoder(embedded, meta.positions, meta.seq_ids)
        launched = decoder(embedded, meta.positions, meta.seq_ids, persistent=False)
        from_ids = decoder.from_ids(meta.input_ids, meta.positions, meta.seq_ids)
        other = "counter" if decoder.tiles.barrier != "counter" else "acquire"  # the counter form against the other:
        decoder.tiles = dataclasses.replace(decoder.tiles, barrier=other)  # step 0 from embeddings has no barrier
        other_form = decoder(embedded, meta.positions, meta.seq_ids)
        other_form_ids = decoder.from_ids(meta.input_ids, meta.positions, meta.seq_ids)
    torch.cuda.synchronize()
    assert torch.equal(other_form, got) and torch.equal(other_form_ids, from_ids)
    for name, out in (("from embeddings", got), ("from ids", from_ids)):
        err = ((out.float() - expected.float()).norm() / expected.float().norm()).item()
        assert err < 2e-2, (name, err)
        assert _cosines(out, expected).min().item() > 0.999, name
    assert torch.equal(got, launched)


@pytest.mark.parametrize("family", ["bert", "xlm-roberta"])
def test_bert_through_the_engine_against_transformers(family, tiny_root):
    """ROSE_PERSISTENT_DECODER=64 with a BERT (and an XLM-R: positions after the padding id) of head dim 32:
    eager, captured, replayed and at its exact size within 0.1 % of transformers in float32, every forward in
    the persistent kernel."""
    from rose_parity import persistent_engine_parity, random_seqs, reference_rows
    from rose_tiny_models import build_bert

    tiny = build_bert(tiny_root, family, heads=2)
    seqs = random_seqs(tiny, [1, 5, 17, 40], seed=3)
    got = persistent_engine_parity(tiny, seqs, reference_rows(tiny, seqs, device="cuda"), routed="64")  # 63 tokens
    assert got["seen"][0] == 1 and got["runs"] and all(r[0] == 0 and r[1] == r[2] for r in got["runs"]), got
    assert max(got["worst"].values()) <= 1e-3, got["worst"]
