"""The persistent decoder's kernel under Triton's interpreter, against the layer-by-layer forward (the cases are
in persistent_interpreted.py, run in a process of its own: the interpreter is chosen at import), and what it
refuses to serve."""

from __future__ import annotations

import types

import pytest

from tests.rose.interpreter import needs_triton, run_interpreted


@needs_triton
def test_kernel_matches_the_layer_by_layer_forward_under_the_interpreter():
    run_interpreted("persistent_interpreted.py", cases=73)


def test_unsupported_decoders_are_named():
    import torch

    from rose.layers.persistent_attach import attach
    from rose.layers.persistent_decoder import unsupported
    from rose.models.qwen3 import DecoderOptions, Qwen3Model

    cfg = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    with torch.device("meta"):
        assert unsupported(Qwen3Model(cfg, causal=True)) is None
        assert "QK-norm" in unsupported(Qwen3Model(cfg, True, DecoderOptions(qk_norm=False)))
        assert "biases" in unsupported(Qwen3Model(cfg, True, DecoderOptions(qkv_bias=True, o_bias=True)))
        assert "windows" in unsupported(Qwen3Model(cfg, True, windows=(64, -1)))
        assert "head_dim" in unsupported(Qwen3Model({**cfg, "head_dim": 24}, causal=True))
        model = Qwen3Model(cfg, causal=True)
    assert attach(model, object(), 0) is None and model.persistent is None  # 0 tokens routed: off


def test_the_setting_reads_off_on_or_a_token_bound(monkeypatch):
    from rose.persistent_routing import AUTO, MAX_TOKENS, ON, routed_tokens

    monkeypatch.setenv("ROSE_PERSISTENT_DECODER", "48")
    assert routed_tokens(None) == 48  # a library caller's None: the variable
    monkeypatch.delenv("ROSE_PERSISTENT_DECODER")
    assert routed_tokens(None) == AUTO  # unset: the default, the measured shapes only
    monkeypatch.setenv("ROSE_PERSISTENT_DECODER", "")
    assert routed_tokens(None) == AUTO  # set but empty reads as unset, as the configs read their variables
    monkeypatch.delenv("ROSE_PERSISTENT_DECODER")

    assert routed_tokens("") == routed_tokens("off") == routed_tokens("0") == 0
    assert routed_tokens("on") == routed_tokens("1") == routed_tokens("TRUE") == ON  # the family's bound: attach
    assert routed_tokens("Auto") == AUTO  # the measured shapes' bounds
    assert routed_tokens("32") == 32 and routed_tokens(str(MAX_TOKENS)) == MAX_TOKENS
    for bad in ("129", "fast", "-4"):
        with pytest.raises(ValueError, match="persistent_decoder"):
            routed_tokens(bad)


def test_the_configs_refuse_a_bad_setting_when_made():
    """`tulip serve --persistent-decoder fast` ends at once naming the setting, not in the engine's start."""
    from rose.cli import EngineConfig
    from tulip.config import TulipConfig

    for config in (TulipConfig, EngineConfig):
        with pytest.raises(ValueError, match="persistent_decoder 'fast': expected off, on, auto"):
            config(persistent_decoder="fast")
        assert config(persistent_decoder="auto").persistent_decoder == "auto"


def test_forward_routes_small_batches_of_its_own_backend_only():
    """Qwen3Model.forward hands a batch to the persistent decoder when it fits and comes with the decoder's
    backend (the runner's); the express lane's backend (a second stream) and larger batches take the layers."""
    import torch

    from rose.meta import MetaLayout
    from rose.models.qwen3 import Qwen3Model

    cfg = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    model = Qwen3Model(cfg, causal=True)
    main, express, sentinel = object(), object(), torch.full((1,), 7.0)

    class Decoder:
        backend = main

        def fits(self, tokens):
            return tokens <= 64

        def __call__(self, residual, positions, seq_ids):
            return sentinel

    model.persistent = Decoder()
    taken = []
    model.forward_layers = lambda meta, backend: iter([taken.append(backend) or torch.zeros(1)])
    ids = torch.zeros(8, dtype=torch.long)
    small = types.SimpleNamespace(layout=MetaLayout(tokens=8, seqs=1, rows=1), input_ids=ids, positions=ids,
                                  seq_ids=ids)
    large = types.SimpleNamespace(layout=MetaLayout(tokens=256, seqs=1, rows=1))
    assert model(small, main) is sentinel
    assert model(small, express) is not sentinel and taken == [express]
    assert model(large, main) is not sentinel and taken == [express, main]


def test_bert_forward_routes_small_batches_of_its_own_backend_only():
    """BertModel.forward hands its normed embeddings (positions after the model's offset) to the persistent
    kernel when the batch fits and comes with the kernel's backend; another backend and larger batches take the
    layers."""
    import torch

    from rose import Batch
    from rose.attention import make_backend
    from rose.meta import ForwardMeta, pack_batch
    from rose.models.bert import BertModel

    cfg = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
           "num_attention_heads": 2, "max_position_embeddings": 64}
    model = BertModel(cfg, position_offset=2).eval()
    main, sentinel, seen = object(), torch.full((1,), 7.0), {}

    class Decoder:
        backend = main

        def fits(self, tokens):
            return tokens <= 4

        def __call__(self, residual, positions, seq_ids):
            seen.update(residual=residual, positions=positions)
            return sentinel

    model.persistent = Decoder()

    def meta_of(n):
        host = pack_batch(Batch.from_sequences([list(range(3, 3 + n))]))
        return ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.max_seqlen, host)

    small, large = meta_of(4), meta_of(8)
    with torch.no_grad():
        assert model(small, main) is sentinel
        assert torch.equal(seen["positions"], small.positions + 2)
        assert torch.equal(seen["residual"], model.embeddings(small.input_ids, small.positions + 2))
        sdpa = make_backend("sdpa", torch.device("cpu"), torch.float32)
        assert model(small, sdpa) is not sentinel
        model.persistent.backend = sdpa
        assert model(large, sdpa) is not sentinel and model(small, sdpa) is sentinel


def test_tulip_and_the_rose_cli_pass_the_setting_to_the_engine(monkeypatch):
    """`tulip serve --persistent-decoder` (TULIP_PERSISTENT_DECODER) and the rose CLI's ROSE_PERSISTENT_DECODER
    reach Engine.from_pretrained, which hands the token bound to the runner."""
    from rose import cli as rose_cli
    from rose.flags import config_from_args
    from tulip import engine_loader
    from tulip.config import TulipConfig

    seen = {}

    def factory(folder, **kwargs):
        seen.update(kwargs)
        return types.SimpleNamespace()

    monkeypatch.setattr(engine_loader, "model_dir", lambda config: "/models/x")
    env = {"TULIP_PERSISTENT_DECODER": "32", "TULIP_DEVICE": "cpu"}
    config = config_from_args(TulipConfig, {}, "TULIP", environ=env)
    monkeypatch.setattr("rose.Engine.from_pretrained", factory)
    engine_loader.build_engine(config)
    assert seen["persistent_decoder"] == "32"
    cfg = config_from_args(rose_cli.EngineConfig, {}, "ROSE", environ={"ROSE_PERSISTENT_DECODER": "on"})
    assert cfg.persistent_decoder == "on"
    # unset, each service's default is auto (the measured shapes only), as the library's
    assert config_from_args(TulipConfig, {}, "TULIP", environ={}).persistent_decoder == "auto"
    assert config_from_args(rose_cli.EngineConfig, {}, "ROSE", environ={}).persistent_decoder == "auto"


def test_attach_refuses_what_it_cannot_serve(monkeypatch):
    import torch

    from rose.layers import persistent_attach, persistent_decoder
    from rose.models.qwen3 import Qwen3Model

    cfg = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    model = Qwen3Model(cfg, causal=True)
    assert persistent_attach.attach(model, object(), 64) is None and model.persistent is None  # weights on a CPU
    with torch.device("meta"):
        wide = Qwen3Model({**cfg, "head_dim": 256}, causal=True)
    assert "head_dim 256" in persistent_decoder.unsupported(wide)


def test_on_routes_each_family_up_to_where_it_was_measured_faster():
    import torch

    from rose.layers import persistent_attach
    from rose.layers.persistent_attach import bound_for
    from rose.models.bert import BertModel
    from rose.models.qwen3 import Qwen3Model
    from rose.persistent_routing import AUTO, ON

    with torch.device("meta"):
        qwen3 = Qwen3Model({"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}, causal=True)
        bert = BertModel({"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
                          "num_attention_heads": 2, "max_position_embeddings": 64})
    assert bound_for(qwen3, ON) == 128 and bound_for(bert, ON) == 16
    assert bound_for(qwen3, 32) == bound_for(bert, 32) == 32 and bound_for(bert, 0) == 0
    assert bound_for(qwen3, AUTO) == bound_for(bert, AUTO) == 0  # shapes never measured: the layers
    with torch.device("meta"):
        qwen3_06b = Qwen3Model({"vocab_size": 50, "hidden_size": 1024, "intermediate_size": 3072,
                                "num_hidden_layers": 1, "num_attention_heads": 16, "num_key_value_heads": 8,
                                "head_dim": 128}, causal=False)
        minilm = BertModel({"vocab_size": 50, "hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 1,
                            "num_attention_heads": 12, "max_position_embeddings": 64})
    assert bound_for(qwen3_06b, AUTO) == 128 and bound_for(minilm, AUTO) == 16
    with pytest.raises(ValueError, match="-5 tokens"):
        persistent_attach.attach(qwen3, object(), -5)  # neither off, on nor a bound


def test_tiles_that_do_not_divide_a_projection_are_refused():
    from rose.layers.persistent_decoder import Tiles

    Tiles().check(1024, 4096, 2048, 3072)  # Qwen3-0.6B
    Tiles().check(2560, 6144, 4096, 9728)  # Qwen3-4B
    with pytest.raises(ValueError, match="gate-up projection's 3000 columns"):
        Tiles().check(1024, 4096, 2048, 3000)
    with pytest.raises(ValueError, match="o projection's K = 2048 in 8 slices"):
        Tiles(split_od=8, k=512).check(1024, 4096, 2048, 3072)
    with pytest.raises(ValueError, match="under 32 wide"):
        Tiles(o=16).check(1024, 4096, 2048, 3072)
    Tiles(prefetch="own").check(1024, 4096, 2048, 3072)
    Tiles(prefetch="idle", k=32).check(1024, 4096, 2048, 3072)  # the idle programs' lines: whole weights, any K step
    with pytest.raises(ValueError, match="whole 128-byte lines"):
        Tiles(prefetch="own", k=32).check(1024, 4096, 2048, 3072)
    with pytest.raises(ValueError, match="stall_every must be a power of two"):
        Tiles(stall_every=48).check(1024, 4096, 2048, 3072)
    for field, word in (("prefetch", "on"), ("barrier", "spin")):
        with pytest.raises(ValueError, match=f"{field} '{word}': one of"):
            Tiles(**{field: word}).check(1024, 4096, 2048, 3072)
    for bad in ({"keys": 24}, {"queries": 48}, {"rows": 8}):
        with pytest.raises(ValueError, match="must be a power of two from 16"):
            Tiles(**bad).check(1024, 4096, 2048, 3072)


def test_bert_encoders_are_taken_and_their_tiles_fitted():
    """BERT-style encoders (post-norm, LayerNorm, biases, GELU) are supported where the head dim is; tiles are
    fitted to shapes the defaults do not divide (all-MiniLM's 384 = 3 x 128)."""
    import torch

    from rose.layers.persistent_decoder import Tiles, fit_tiles, unsupported
    from rose.layers.persistent_models import shapes
    from rose.models.bert import BertModel

    cfg = {"vocab_size": 50, "hidden_size": 384, "intermediate_size": 1536, "num_hidden_layers": 2,
           "num_attention_heads": 12, "max_position_embeddings": 64}
    with torch.device("meta"):
        minilm = BertModel(cfg)
        assert unsupported(minilm) is None
        assert shapes(minilm) == (12, 12, 32, 384, 1536)
        assert "head_dim 16" in unsupported(BertModel({**cfg, "num_attention_heads": 24}))
        assert "GELU" in unsupported(BertModel({**cfg, "hidden_act": "gelu_new"}))
    assert fit_tiles(1024, 4096, 2048, 3072) == Tiles()  # Qwen3-0.6B: the defaults
    tiles = fit_tiles(384, 1152, 384, 1536)
    assert (tiles.k, tiles.split_qkv, tiles.split_od) == (128, 3, 3)
    tiles.check(384, 1152, 384, 1536)
    fit_tiles(768, 2304, 768, 3072).check(768, 2304, 768, 3072)  # BERT-base, BGE-base, E5-base
    fit_tiles(1024, 3072, 1024, 4096).check(1024, 3072, 1024, 4096)  # bert-large, bge-large, XLM-R large (BGE-M3)


def test_the_engine_routes_to_the_kernel_only_once_its_warm_up_launched_it(tiny_models, caplog):
    """The runner builds the decoder at start but routes to it only from the engine's warm-up on (after the kernels
    compiled ahead, the kernel manifest recording its variants), before the warm-up's first step; a warm that fails
    (a launch, a grid that stalls) leaves the layers serving, logged."""
    from rose.engine import Engine
    from rose.layers.persistent_attach import enable

    order = []

    class Decoder:
        backend, routed, programs = None, 128, 4

        def __init__(self, fail=False):
            self.fail = fail

        def warm(self):
            order.append("warm")
            if self.fail:
                raise RuntimeError("the grid barrier stalled at 16 tokens")
            return 1

        def fits(self, tokens):  # never routed here: the CPU's layers serve the probe
            order.append("fits")
            return False

    model = types.SimpleNamespace(persistent=None)
    with caplog.at_level("WARNING", logger="rose.persistent_decoder"):
        assert enable(model, Decoder(fail=True)) is False and model.persistent is None
    assert "persistent decoder off: the grid barrier stalled" in caplog.text
    good = Decoder()
    assert enable(model, good) is True and model.persistent is good

    engine = Engine.from_pretrained(tiny_models["qwen3"].path, device="cpu", cuda_graphs=False)
    try:
        runner = engine.runner
        assert runner._persistent is None and runner.model.persistent is None  # a CPU: nothing built
        assert engine.stats()["persistent_decoder_tokens"] == 0  # rose_persistent_decoder_tokens: the layers serve
        order.clear()
        runner._persistent = pending = Decoder()  # as attach(warm=False) leaves it on a GPU
        pending.backend = runner.backend  # the runner's forwards are routed to it, the express lane's never
        assert runner.model.persistent is None  # built, not routed to
        # the workers compiling the manifest's variants ahead (a GPU's start): joined before the kernel compiles
        engine.kernels_ahead = types.SimpleNamespace(wait=lambda: order.append("join") or {})
        engine.warmup()
        assert runner.model.persistent is pending
        assert order[:3] == ["join", "warm", "fits"]  # after the workers, before the probe batch
        assert engine.stats()["persistent_decoder_tokens"] == 128
        assert runner.warm_persistent() is False  # once
    finally:
        engine.close()


def test_tiles_change_by_token_block(monkeypatch):
    """The changes measured faster at one token block apply there only, to the buffers and to what the kernel is
    launched with; tiles given by a caller (a benchmark's sweep) serve every block; a block without the heads step
    takes a layer in 7 steps where the others take 8; a change of the least block, or one that does not divide a
    projection, is refused; the table's entries fit their shapes and a fitted decoder of those shapes takes them."""
    import torch

    from rose.layers import persistent_decoder
    from rose.layers.persistent_decoder import PersistentDecoder
    from rose.layers.persistent_tiles import (
        BLOCK_CHANGES,
        Tiles,
        block_tiles,
        fit_tiles,
    )
    from rose.models.qwen3 import Qwen3Model

    qwen3_06b = (1024, 4096, 2048, 3072)  # hidden, qkv, q, inner
    for bad, match in (({64: {"rows": 32}}, "rows cannot"),
                       ({24: {"queries": 16}}, "powers of two"), ({8: {"queries": 16}}, "from 16"),
                       ({64: {"o": 48}}, "not whole tiles")):
        with pytest.raises(ValueError, match=match):
            block_tiles(Tiles(), bad, *qwen3_06b)

    cfg = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    tiles = Tiles(qkv=32, o=32, gate_up=32, down=32, split_qkv=2, split_od=2, k=16, keys=16, queries=16)
    decoder = PersistentDecoder(Qwen3Model(cfg, causal=True), tiles, programs=2)
    assert [decoder.tiles_at(t) for t in (1, 16, 17, 64, 128)] == [tiles] * 5  # tiles given: every block
    decoder.change_blocks({64: {"queries": 32, "split_od": 1, "stages": 2}})
    assert [decoder.tiles_at(t).split_od for t in (1, 16, 32, 33, 64, 65)] == [2, 2, 2, 1, 1, 2]
    launched = []
    monkeypatch.setattr(persistent_decoder, "decoder_kernel", {(2,): lambda *a, **meta: launched.append(
        {**meta, "final": a[-3], "last": a[-1]})})
    for t in (20, 40):  # blocks 32 and 64
        work = decoder.workspace(torch.zeros(t, 64), torch.arange(t), torch.zeros(t, dtype=torch.long))
        assert work.od.shape[0] == (1 if t == 40 else 2)  # the buffers of the block's own tiles
        decoder.run(work, 0, decoder.steps(t))
    assert [(m["BLOCK_M"], m["S_OD"], m["BQ"], m["num_stages"]) for m in launched] == [(32, 2, 16, 3), (64, 1, 32, 2)]
    decoder.change_blocks({32: {"heads": False}})  # attention computing its own heads at 32 tokens only
    assert [(decoder.kinds(t), decoder.steps(t)) for t in (20, 40)] == [((0, 1, 2, 3, 4, 5, 6), 8),
                                                                         ((0, 1, 7, 2, 3, 4, 5, 6), 9)]
    assert [decoder.step_kind(s, 20) for s in (2, 7)] == [(0, 2), (1, 0)]  # attention third; the final norm
    assert [decoder.step_kind(s, 40) for s in (2, 8)] == [(0, 7), (1, 0)]  # the heads step third
    launched.clear()
    for t in (20, 40):
        work = decoder.workspace(torch.zeros(t, 64), torch.arange(t), torch.zeros(t, dtype=torch.long))
        assert work.heads.shape[0] == (1 if t == 20 else t)  # the heads step's buffer only where it runs
        decoder(torch.zeros(t, 64), torch.arange(t), torch.zeros(t, dtype=torch.long), persistent=True)
    assert [(m["PHASES"], m["HEADS"], m["final"], m["last"]) for m in launched] == [(7, False, 7, 8), (8, True, 8, 9)]
    decoder.tiles = tiles  # a caller's tiles: every block again
    assert decoder.tiles_at(64) == tiles

    for shape, changes in BLOCK_CHANGES.items():  # guards on the table: each entry fits, and changes something
        blocks = block_tiles(fit_tiles(*shape), changes, *shape)
        assert set(blocks) == set(changes) and all(blocks[b] != fit_tiles(*shape) for b in blocks)
    with torch.device("meta"):  # a fitted decoder of the 0.6B's shapes takes its entry, block by block
        model = Qwen3Model({**cfg, "hidden_size": 1024, "intermediate_size": 3072, "num_attention_heads": 16,
                            "num_key_value_heads": 8, "head_dim": 128}, causal=True)
    fitted = PersistentDecoder(model, programs=2)
    expected = block_tiles(fit_tiles(*qwen3_06b), BLOCK_CHANGES[qwen3_06b], *qwen3_06b)
    for t in (1, 16, 17, 32, 33, 64, 65, 128):
        assert fitted.tiles_at(t) == expected.get(fitted.block_m(t), fit_tiles(*qwen3_06b)), t
