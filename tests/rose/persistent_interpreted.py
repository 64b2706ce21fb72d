"""rose.layers.persistent_decoder under Triton's interpreter (TRITON_INTERPRET=1, numpy on the CPU) against the
layer-by-layer Qwen3Model forward (float32, SDPA): one launch per phase over three programs, and the
persistent kernel with its barriers on one program (the interpreter runs programs one after another, so a
barrier between several never opens). Run by test_rose_persistent_decoder.py in a process of its own; prints
one line per case and exits 1 on a mismatch."""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"


def tiny_qwen3(causal: bool, seed: int):
    import torch

    from rose.models.qwen3 import Qwen3Model

    cfg = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
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
    cases = [([5], None), ([3, 9, 1, 6], None), ([7, 7, 7], MetaLayout(tokens=24, seqs=4, rows=3)), ([1], None),
             ([30, 12], None)]
    for causal in (True, False):
        for lens, layout in cases:
            model = tiny_qwen3(causal, seed=len(lens) + 10 * causal)
            gen = torch.Generator().manual_seed(sum(lens))
            batch = Batch.from_sequences([torch.randint(1, 50, (n,), generator=gen).tolist() for n in lens])
            host = pack_batch(batch, layout)
            meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen, host)
            with torch.no_grad():
                expected = model(meta, make_backend("sdpa", torch.device("cpu"), torch.float32))
                embedded = model.embed_tokens(meta.input_ids)
                for programs, persistent in ((3, False), (1, True)):
                    decoder = PersistentDecoder(model, tiles, programs=programs)
                    got = decoder(embedded, meta.positions, meta.seq_ids, persistent=persistent)
                    err = ((got - expected).norm() / expected.norm()).item()
                    ok = err < 1e-4 and got.shape == expected.shape
                    failed += not ok
                    print(f"causal={causal} lens={lens} tokens={host.layout.tokens} programs={programs} "
                          f"persistent={persistent}: rel err {err:.2e} {'ok' if ok else 'MISMATCH'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
