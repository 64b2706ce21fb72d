"""rose.layers.persistent_decoder under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU) against the
layer-by-layer Qwen3Model forward (float32, SDPA): one launch per phase over three programs, and the
persistent kernel with its barriers on one program (the interpreter runs programs one after another, so a
barrier between several never opens). Run by test_rose_persistent_decoder.py in a process of its own; prints
one line per case and exits 1 on a mismatch."""

from __future__ import annotations

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


def main() -> int:
    import torch

    from rose import Batch
    from rose.attention import make_backend
    from rose.layers.persistent_decoder import PersistentDecoder, Tiles
    from rose.meta import ForwardMeta, MetaLayout, pack_batch

    failed = 0
    tiles = Tiles(qkv=32, o=32, gate_up=32, down=32, split_qkv=2, split_od=2, k=16, warps=4, stages=1,
                  queries=16)
    cases = [([5], None, 64), ([3, 9, 1, 6], None, 64), ([7, 7, 7], MetaLayout(tokens=24, seqs=4, rows=3), 64),
             ([1], None, 64), ([30, 12], None, 64), ([11, 4], None, 96)]  # hidden 96: the norms' masked columns
    for causal in (True, False):
        for lens, layout, hidden in cases:
            model = tiny_qwen3(causal, seed=len(lens) + 10 * causal, hidden=hidden)
            gen = torch.Generator().manual_seed(sum(lens))
            batch = Batch.from_sequences([torch.randint(1, 50, (n,), generator=gen).tolist() for n in lens])
            host = pack_batch(batch, layout)
            meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen, host)
            backend = make_backend("sdpa", torch.device("cpu"), torch.float32)
            with torch.no_grad():
                expected = model(meta, backend)
                embedded = model.embed_tokens(meta.input_ids)
                for programs, persistent in ((3, False), (1, True)):
                    decoder = PersistentDecoder(model, tiles, programs=programs)
                    got = decoder(embedded, meta.positions, meta.seq_ids, persistent=persistent)
                    err = ((got - expected).norm() / expected.norm()).item()
                    ok = err < 1e-4 and got.shape == expected.shape
                    failed += not ok
                    verdict = "ok" if ok else "MISMATCH"
                    print(f"causal={causal} lens={lens} tokens={host.layout.tokens} hidden={hidden} "
                          f"programs={programs} persistent={persistent}: rel err {err:.2e} {verdict}")
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
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
