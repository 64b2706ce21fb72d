"""rose.layers.persistent_decoder under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU) against the
layer-by-layer Qwen3Model forward (float32, SDPA): one launch per phase over three programs, and the
persistent kernel with its barriers on one program (the interpreter runs programs one after another, so a
barrier between several never opens: the stall cases check that such a wait gives up). Run by
test_rose_persistent_decoder.py in a process of its own; prints one line per case and exits 1 on a mismatch."""

from __future__ import annotations

import dataclasses
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def tiny_qwen3(causal: bool, seed: int, hidden: int = 64):
    import torch

    from rose.models.qwen3 import Qwen3Model

    cfg = {"vocab_size": 50, "hidden_size": hidden, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32, "rope_theta": 10000.0,
           "rms_norm_eps": 1e-6}
    model = Qwen3Model(cfg, causal=causal)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.1 if "norm" in name else 0.15
            p.copy_((1.0 if "norm" in name else 0.0) + scale * torch.randn(p.shape, generator=gen))
    return model.eval()


def packed(lens: list[int], layout, low: int = 1):
    """(host, meta) of a batch of random ids of these lengths (ids from `low`), packed at `layout` on the CPU."""
    import torch

    from rose import Batch
    from rose.meta import ForwardMeta, pack_batch

    gen = torch.Generator().manual_seed(sum(lens))
    batch = Batch.from_sequences([torch.randint(low, 50, (n,), generator=gen).tolist() for n in lens])
    host = pack_batch(batch, layout)
    return host, ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen, host)


def against(model, tiles, embedded, meta, expected, label: str, blocks: dict | None = None) -> int:
    """The kernel launched a phase at a time over three programs, and persistent on one, against `expected`;
    prints a line each, returns how many missed. blocks: changes to `tiles` by token block (change_blocks)."""
    from rose.layers.persistent_decoder import PersistentDecoder

    failed = 0
    for programs, persistent in ((3, False), (1, True)):
        decoder = PersistentDecoder(model, tiles, programs=programs)
        decoder.change_blocks(blocks or {})
        got = decoder(embedded, meta.positions, meta.seq_ids, persistent=persistent)
        err = ((got - expected).norm() / expected.norm()).item()
        ok = err < 1e-4 and got.shape == expected.shape
        failed += not ok
        print(f"{label} programs={programs} persistent={persistent}: rel err {err:.2e} {'ok' if ok else 'MISMATCH'}")
    return failed


def main() -> int:
    import torch

    from rose.attention import make_backend
    from rose.layers.persistent_decoder import PersistentDecoder, Tiles
    from rose.meta import MetaLayout

    failed = 0
    tiles = Tiles(qkv=32, o=32, gate_up=32, down=32, split_qkv=2, split_od=2, k=16, warps=4, stages=1, keys=16,
                  queries=16)
    cases = [([5], None, 64), ([3, 9, 1, 6], None, 64), ([7, 7, 7], MetaLayout(tokens=24, seqs=4, rows=3), 64),
             ([1], None, 64), ([30, 12], None, 64), ([11, 4], None, 96)]  # hidden 96: the norms' masked columns
    for causal in (True, False):
        for lens, layout, hidden in cases:
            model = tiny_qwen3(causal, seed=len(lens) + 10 * causal, hidden=hidden)
            host, meta = packed(lens, layout)
            backend = make_backend("sdpa", torch.device("cpu"), torch.float32)
            with torch.no_grad():
                expected = model(meta, backend)
                label = f"causal={causal} lens={lens} tokens={host.layout.tokens} hidden={hidden}"
                failed += against(model, tiles, model.embed_tokens(meta.input_ids), meta, expected, label)
                if lens in ([3, 9, 1, 6], [30, 12]):  # attention computing its own heads (no heads step)
                    failed += against(model, dataclasses.replace(tiles, heads=False), model.embed_tokens(
                        meta.input_ids), meta, expected, f"{label} own heads")
                if lens == [30, 12]:  # the default attention: every key of the block at once, 32 queries an item
                    failed += against(model, dataclasses.replace(tiles, keys=128, queries=32), model.embed_tokens(
                        meta.input_ids), meta, expected, f"{label} default keys and queries")
                    # its 42 tokens in the 64-token block, whose own tiles cut every phase otherwise (and a
                    # change at the 16-token block, which this batch does not take)
                    blocks = {64: {"queries": 32, "keys": 32, "split_qkv": 1, "split_od": 1, "k": 32},
                              16: {"split_qkv": 4}}
                    failed += against(model, tiles, model.embed_tokens(meta.input_ids), meta, expected,
                                      f"{label} the 64-token block's own tiles", blocks)
            if lens == [30, 12]:  # after the weights were stacked: the layers still read them, and forward routes
                with torch.no_grad():
                    layers_after = model(meta, backend)
                    model.persistent = PersistentDecoder(model, tiles, programs=1, backend=backend)
                    routed = model(meta, backend)
                    model.persistent = None
                for name, got, bound in (("layers after stacking", layers_after, 0.0),
                                         ("routed through forward", routed, 1e-4)):
                    err = ((got - expected).norm() / expected.norm()).item()
                    ok = err <= bound
                    failed += not ok
                    print(f"causal={causal} {name}: rel err {err:.2e} {'ok' if ok else 'MISMATCH'}")
    failed += stalls() + phases(tiles) + bert(tiles)
    return 1 if failed else 0


def tiny_bert(seed: int, hidden: int = 64, offset: int = 0, token_types: bool = False):
    import torch

    from rose.models.bert import BertModel

    cfg = {"vocab_size": 50, "hidden_size": hidden, "intermediate_size": 128, "num_hidden_layers": 2,
           "num_attention_heads": hidden // 32, "max_position_embeddings": 80, "layer_norm_eps": 1e-12}
    model = BertModel(cfg, position_offset=offset, token_types=token_types)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            base = 1.0 if "LayerNorm.weight" in name else 0.0
            scale = 0.1 if "LayerNorm" in name or "bias" in name else 0.15
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))
    return model.eval()


def bert(tiles) -> int:
    """A BERT-style encoder (post-norm, LayerNorm, biases, GELU, no rotary) against BertModel's layer-by-layer
    forward: ragged, padded, hidden 96 (the LayerNorm's masked columns), XLM-R's position offset; launched over
    three programs and persistent on one; and routed through BertModel.forward."""
    import torch

    from rose.attention import make_backend
    from rose.layers.persistent_decoder import PersistentDecoder
    from rose.meta import MetaLayout

    failed = 0
    cases = [([5], None, 64, 0), ([3, 9, 1, 6], None, 64, 2), ([7, 7, 7], MetaLayout(tokens=24, seqs=4, rows=3), 64, 0),
             ([30, 12], None, 64, 0), ([11, 4], None, 96, 0)]
    for lens, layout, hidden, offset in cases:
        model = tiny_bert(seed=len(lens), hidden=hidden, offset=offset)
        host, meta = packed(lens, layout, low=3)
        backend = make_backend("sdpa", torch.device("cpu"), torch.float32)
        with torch.no_grad():
            expected = model(meta, backend)
            failed += against(model, tiles, model.embeddings(meta.input_ids, meta.positions + offset), meta, expected,
                              f"bert lens={lens} tokens={host.layout.tokens} hidden={hidden} offset={offset}")
            for programs, persistent in ((3, False), (1, True)):  # the embeddings in the kernel's first step
                got = PersistentDecoder(model, tiles, programs=programs).from_ids(
                    meta.input_ids, meta.positions + offset, meta.seq_ids, persistent=persistent)
                err = ((got - expected).norm() / expected.norm()).item()
                failed += not err < 1e-4
                print(f"bert from ids lens={lens} offset={offset} programs={programs}: rel err {err:.2e} "
                      f"{'ok' if err < 1e-4 else 'MISMATCH'}")
            if lens == [30, 12]:
                model.persistent = PersistentDecoder(model, tiles, programs=1, backend=backend)
                err = ((model(meta, backend) - expected).norm() / expected.norm()).item()
                model.persistent = None
                failed += not err < 1e-4
                print(f"bert routed through forward: rel err {err:.2e} {'ok' if err < 1e-4 else 'MISMATCH'}")
    failed += bert_pairs(tiles)
    return failed


def bert_pairs(tiles) -> int:
    """A cross-encoder's BERT (token types: a pair's second text is type 1) from its ids, types read in step 0."""
    import torch

    from rose import Batch
    from rose.attention import make_backend
    from rose.layers.persistent_decoder import PersistentDecoder
    from rose.meta import ForwardMeta, pack_batch

    model = tiny_bert(seed=9, token_types=True)
    gen = torch.Generator().manual_seed(9)
    seqs = [torch.randint(3, 50, (n,), generator=gen).tolist() for n in (9, 14)]
    types = [[0] * 4 + [1] * 5, [0] * 6 + [1] * 8]
    host = pack_batch(Batch.from_sequences(seqs, token_types=types), type_vocab_size=2)
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen, host)
    with torch.no_grad():
        expected = model(meta, make_backend("sdpa", torch.device("cpu"), torch.float32))
        got = PersistentDecoder(model, tiles, programs=1).from_ids(meta.input_ids, meta.positions, meta.seq_ids,
                                                                   meta.token_types)
        plain = PersistentDecoder(model, tiles, programs=1).from_ids(meta.input_ids, meta.positions, meta.seq_ids)
    err = ((got - expected).norm() / expected.norm()).item()
    ok = err < 1e-4 and not torch.allclose(plain, expected, atol=1e-3)  # the types matter, and are read
    print(f"bert pairs from ids with token types: rel err {err:.2e} {'ok' if ok else 'MISMATCH'}")
    return not ok


def phases(tiles) -> int:
    """Every step launched alone against the layer path's kernels (persistent_phases.check_phases, the GPU
    test's checks, here in float32 over three programs)."""
    import torch

    from rose.layers.persistent_decoder import PersistentDecoder
    from tests.rose.persistent_phases import check_phases

    failed = 0
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 50, (21,), generator=gen)
    positions = torch.cat([torch.arange(13), torch.arange(8)])
    seq_ids = torch.tensor([0] * 13 + [1] * 8)
    for family, causal, heads in (("qwen3", True, True), ("qwen3", False, True), ("bert", False, True),
                                  ("qwen3", True, False)):
        model = tiny_qwen3(causal, seed=5) if family == "qwen3" else tiny_bert(seed=5)
        decoder = PersistentDecoder(model, dataclasses.replace(tiles, heads=heads), programs=3)
        try:
            with torch.no_grad():
                embedded = model.embed_tokens(ids) if family == "qwen3" else model.embeddings(ids, positions)
                steps = check_phases(decoder, embedded, positions, seq_ids, causal)
            expected = 2 * (8 if heads else 7) + 1  # 2 layers of 8 or 7 steps, then the final norm
            verdict = "ok" if steps == decoder.steps(len(ids)) == expected else f"MISMATCH: {steps} steps"
        except AssertionError as exc:
            verdict = f"MISMATCH: {exc}"
        failed += verdict != "ok"
        print(f"phases: {family} causal={causal} heads step={heads} each step against the layer path's kernels "
              f"{verdict}")
    return failed


def stalls() -> int:
    """Two programs with barriers under the interpreter: program 0 waits for a program that runs only after it
    ends, so its wait gives up (a small spin limit), sets the stall word and every later wait ends at once:
    the launch returns (no hang) with every row NaN, stalled() says so, and warm() refuses the decoder."""
    import torch

    from rose.layers.persistent_decoder import PersistentDecoder, Tiles

    tiles = Tiles(qkv=32, o=32, gate_up=32, down=32, split_qkv=2, split_od=2, k=16, warps=4, stages=1, keys=16,
                  queries=16)
    model = tiny_qwen3(True, seed=3)
    failed = 0
    with torch.no_grad():
        embedded = model.embed_tokens(torch.arange(1, 6))
        zeros = torch.zeros(5, dtype=torch.int64)
        for programs in (1, 2):
            decoder = PersistentDecoder(model, tiles, programs=programs, routed=16)
            decoder.spins = 32
            got = decoder(embedded, torch.arange(5), zeros)
            stalled = decoder.stalled()
            ok = stalled == (programs > 1) and bool(got.isnan().all() if stalled else got.isfinite().all())
            failed += not ok
            print(f"stall: programs={programs} stalled={stalled} rows NaN={bool(got.isnan().all())} "
                  f"{'ok' if ok else 'MISMATCH'}")
        try:
            decoder.warm()
            refused = ""
        except RuntimeError as exc:
            refused = str(exc)
        ok = "stalled" in refused and "2 programs" in refused
        failed += not ok
        print(f"stall: warm-up refuses a grid that stalls ({refused!r}) {'ok' if ok else 'MISMATCH'}")
    return failed


if __name__ == "__main__":
    sys.exit(main())
