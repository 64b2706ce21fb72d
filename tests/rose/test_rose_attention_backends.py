"""FlashInfer / FA4 backends, the serving profile and `auto` (issue 7).

On any machine: missing-package and no-GPU errors, profile files, per-bucket dispatch (fake backends),
`auto` on a CPU, the A/B's winner choice. Marked gpu (run on the H200): every backend against a float32
reference on ragged, bucket-padded batches (GQA, causal and not), FlashInfer re-planned between CUDA graph
replays, and whole-model graphs verified against eager. FlashInfer fa2 compiles in ~25 s on first use;
fa3 (~85 s) and FA4 run only with ROSE_TEST_SLOW_JIT=1.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import pytest
import torch

from rose import Batch
from rose.attention import (
    AttentionBackend,
    AttentionBackendError,
    AttentionShape,
    ServingProfile,
    make_backend,
)
from rose.attention.profile import (
    PerBucketBackend,
    ProfileError,
    backend_from_profile,
    winners_per_bucket,
)
from rose.attention.sdpa import SdpaBackend
from rose.meta import ForwardMeta, MetaLayout, pack_batch

CPU = torch.device("cpu")
SHAPE = AttentionShape(16, 8, 128)


def meta_for(lengths, layout=None, device="cpu", graph=True):
    host = pack_batch(Batch.from_sequences([[1] * n for n in lengths]), layout)
    buf = torch.from_numpy(host.packed).to(device)
    return ForwardMeta.from_buffer(buf, host.layout, host.layout.seqlen_bound if graph else host.max_seqlen, host,
                                   graph=graph)


# -- errors on machines without the packages or a GPU -------------------------------------------------------
@pytest.mark.parametrize("name", ["flashinfer-fa2", "flashinfer-fa3", "fa4", "triton"])
def test_gpu_backends_refuse_a_cpu_with_a_clear_error(name):
    with pytest.raises(AttentionBackendError, match="CUDA only"):
        make_backend(name, CPU, torch.float32, shape=SHAPE)


@pytest.mark.parametrize("module, loader, hint", [
    ("flashinfer", "rose.attention.flashinfer:import_flashinfer", "ivy-tulip-rose[flashinfer]"),
    ("flash_attn.cute", "rose.attention.fa4:import_fa4", "ivy-tulip-rose[fa4]"),
])
def test_missing_package_error_names_the_pip_extra(monkeypatch, module, loader, hint):
    import importlib

    monkeypatch.setitem(sys.modules, module, None)  # import of a None entry raises ImportError
    mod, fn = loader.split(":")
    with pytest.raises(AttentionBackendError, match=hint.replace("[", r"\[").replace("]", r"\]")):
        getattr(importlib.import_module(mod), fn)()


def test_flashinfer_needs_the_model_shape():
    with pytest.raises(AttentionBackendError, match="attention shape"):
        make_backend("flashinfer-fa2", CPU, torch.float32)


def test_unknown_backend_lists_the_names():
    with pytest.raises(AttentionBackendError, match="flashinfer-fa3"):
        make_backend("flash", CPU, torch.float32)


def test_attention_shape_from_spec():
    qwen = SimpleNamespace(arch="qwen3", causal=True, config={"num_attention_heads": 16, "num_key_value_heads": 8,
                                                               "head_dim": 128, "hidden_size": 1024})
    bert = SimpleNamespace(arch="bert", causal=False, config={"num_attention_heads": 12, "hidden_size": 384})
    assert AttentionShape.from_spec(qwen) == AttentionShape(16, 8, 128, True)
    assert AttentionShape.from_spec(bert) == AttentionShape(12, 12, 32, False)


def test_flashinfer_int_workspace_grows_with_the_layout():
    from rose.attention.flashinfer import int_workspace_bytes

    small, big = int_workspace_bytes(128, 1, SHAPE), int_workspace_bytes(32768, 256, AttentionShape(64, 8, 128))
    assert small == 1 << 20 and big > small


def test_kernel_cache_dir_sets_both_libraries_variables(monkeypatch, tmp_path):
    from rose.kernel_cache import use_kernel_cache

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHINFER_", "FLASH_ATTENTION_", "ROSE_KERNEL"))}
    monkeypatch.setattr(os, "environ", env)  # the variables set below must not leak into other tests
    assert use_kernel_cache(None) is None
    root = use_kernel_cache(tmp_path)
    assert os.environ["FLASHINFER_WORKSPACE_BASE"] == str(root / "flashinfer")
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"] == str(root / "fa4")
    assert os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] == "1" and env["ROSE_KERNEL_CACHE_DIR"] == str(root)
    assert os.environ["TRITON_CACHE_DIR"] == str(root / "triton") and (root / "triton").is_dir()
    os.environ["FLASHINFER_WORKSPACE_BASE"] = "/elsewhere"
    use_kernel_cache(None)  # the variable only fills gaps: an explicit setting stays
    assert os.environ["FLASHINFER_WORKSPACE_BASE"] == "/elsewhere"


def test_triton_cache_only_where_it_can_be_written(monkeypatch, tmp_path):
    """A kernel cache where Triton cannot write (an image's own folder under a read-only root, a volume
    filled once) must not become Triton's cache: its first compile would fail the replica's start."""
    from rose.kernel_cache import use_kernel_cache

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHINFER_", "FLASH_ATTENTION_", "ROSE_KERNEL",
                                                                    "TRITON_"))}
    monkeypatch.setattr(os, "environ", env)
    (tmp_path / "triton").write_text("")  # no directory can be made there (as root too, unlike a chmod)
    use_kernel_cache(tmp_path)
    assert "TRITON_CACHE_DIR" not in os.environ and os.environ["FLASHINFER_WORKSPACE_BASE"]


def test_an_engine_puts_triton_s_cache_under_the_kernel_cache(monkeypatch, tmp_path, engine_for):
    from rose.engine import Engine

    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHINFER_", "FLASH_ATTENTION_", "TRITON_"))}
    env["ROSE_KERNEL_CACHE_DIR"] = str(tmp_path / "kernels")
    monkeypatch.setattr(os, "environ", env)
    engine = Engine.from_pretrained(engine_for("bert").spec.model_dir, device="cpu")
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "kernels" / "triton")
    engine.close()


# -- the serving profile ------------------------------------------------------------------------------------
def test_profile_round_trip_and_bucket_lookup(tmp_path):
    profile = ServingProfile({128: "varlen", 4096: "flashinfer-fa3", 512: "varlen"}, {"gpu": "H200"})
    path = profile.save(tmp_path / "rose_profile.json")
    loaded = ServingProfile.load(path)
    assert loaded.attention == profile.attention and loaded.info["gpu"] == "H200"
    assert [loaded.backend_for(t) for t in (1, 128, 129, 512, 513, 4096, 99999)] == [
        "varlen", "varlen", "varlen", "varlen", "flashinfer-fa3", "flashinfer-fa3", "flashinfer-fa3"]


@pytest.mark.parametrize("text", ["{", "[]", '{"attention": {"x": "sdpa"}}', '{"attention": {}}',
                                  '{"version": 9, "attention": {"128": "sdpa"}}'])
def test_malformed_profiles_raise_profile_error(tmp_path, text):
    path = tmp_path / "rose_profile.json"
    path.write_text(text)
    with pytest.raises(ProfileError):
        ServingProfile.load(path)


def test_winners_map_every_bucket_to_the_nearest_measured_shape():
    got = winners_per_bucket([(128, "a"), (4096, "b"), (25600, "c")], [16, 128, 512, 1024, 4096, 20480, 32768])
    assert got == {16: "a", 128: "a", 512: "a", 1024: "b", 4096: "b", 20480: "c", 32768: "c"}
    with pytest.raises(ProfileError):
        winners_per_bucket([], [128])


class FakeBackend(AttentionBackend):
    def __init__(self, name, graph_safe=True):
        self.name, self.graph_safe, self.calls = name, graph_safe, []

    def plan(self, meta):
        self.calls.append(("plan", meta.layout.tokens))

    def prepare(self, meta, causal, window=-1):
        self.calls.append(("prepare", meta.layout.tokens))
        return self.name

    def forward(self, q, k, v, meta, causal, scale, state=None, window=-1):
        assert state == self.name, "the state comes from the same backend's prepare"
        self.calls.append(("forward", meta.layout.tokens))
        return q * 0 + len(self.name)


def test_per_bucket_backend_dispatches_on_the_padded_token_count():
    small, large = FakeBackend("small"), FakeBackend("large-one")
    backend = PerBucketBackend(ServingProfile({128: "small", 1024: "small", 4096: "large-one"}),
                               {"small": small, "large-one": large})
    assert backend.name == "profile(small<=1024,large-one<=4096)" and backend.graph_safe
    for lengths, layout, want in (([100], MetaLayout(128, 2, 1), small), ([1000, 900], MetaLayout(2048, 4, 2), large),
                                  ([5000], None, large)):
        meta = meta_for(lengths, layout)
        backend.plan(meta)
        q = torch.zeros(meta.layout.tokens, 2, 4)
        out = backend.forward(q, q, q, meta, False, 0.5, backend.prepare(meta, False))
        assert float(out[0, 0, 0]) == len(want.name)
        assert want.calls[-3:] == [("plan", meta.layout.tokens), ("prepare", meta.layout.tokens),
                                   ("forward", meta.layout.tokens)]


def test_per_bucket_backend_rejects_backends_a_graph_cannot_capture():
    with pytest.raises(AttentionBackendError, match="graph-safe"):
        PerBucketBackend(ServingProfile({128: "cpu"}), {"cpu": FakeBackend("cpu", graph_safe=False)})


def test_profile_backend_that_cannot_run_falls_back_with_a_warning():
    built, warnings = [], []

    def build(name):
        if name == "fa4":
            raise AttentionBackendError("fa4 not installed")
        built.append(name)
        return FakeBackend(name)

    profile = ServingProfile({128: "varlen", 1024: "fa4", 4096: "fa4", 8192: "flashinfer-fa3"})
    backend = backend_from_profile(profile, build, "varlen", warnings.append)
    assert isinstance(backend, PerBucketBackend)
    assert backend.profile.attention == {128: "varlen", 1024: "varlen", 4096: "varlen", 8192: "flashinfer-fa3"}
    assert sorted(built) == ["flashinfer-fa3", "varlen"] and len(warnings) == 1 and "fa4" in warnings[0]
    single = backend_from_profile(ServingProfile({128: "fa4"}), build, "varlen", warnings.append)
    assert single.name == "varlen", "one backend left: no dispatcher"


def test_auto_on_a_cpu_ignores_the_profile_and_uses_sdpa(tmp_path):
    ServingProfile({128: "flashinfer-fa3"}).save(tmp_path / "rose_profile.json")
    spec = SimpleNamespace(model_dir=tmp_path, arch="qwen3", causal=False,
                           config={"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_size": 64})
    assert isinstance(make_backend("auto", CPU, torch.float32, spec), SdpaBackend)
    assert isinstance(make_backend("auto", CPU, torch.bfloat16, spec), SdpaBackend)


def test_auto_default_is_triton_where_it_runs_the_shape_else_varlen(monkeypatch):
    """Without a profile, CUDA in half precision: triton where its own checks pass for the model's shape (run
    here against a pretend sm90 GPU), sliding windows included (ModernBERT's local layers and MPNet's bias
    need nothing of the shape: the kernel serves both); varlen where they refuse (a head dim it lacks, an old
    GPU); sdpa without torch's varlen; a CPU gets sdpa."""
    from rose import attention
    from rose.attention import default_backend_name, triton_varlen

    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(attention, "varlen_available", lambda: True)
    if triton_varlen.triton is None:  # CPU torch without Triton: the checks below are about the shapes
        monkeypatch.setattr(triton_varlen, "triton", SimpleNamespace())
    bf16 = torch.bfloat16
    assert default_backend_name(cuda, bf16, AttentionShape(16, 8, 128, True)) == "triton"
    assert default_backend_name(cuda, bf16, AttentionShape(12, 12, 32)) == "triton"  # MiniLM
    assert default_backend_name(cuda, bf16, AttentionShape(16, 8, 128, True, window=4096)) == "triton"
    assert default_backend_name(cuda, bf16, AttentionShape(4, 1, 256, True, window=512)) == "triton"  # Gemma 3
    assert default_backend_name(cuda, bf16, AttentionShape(12, 12, 80)) == "varlen"  # head dim 80
    assert default_backend_name(cuda, bf16, AttentionShape(12, 12, 80, window=4096)) == "varlen"
    assert default_backend_name(cuda, torch.float32, AttentionShape(16, 8, 128)) == "sdpa", "neither kernel takes fp32"
    assert default_backend_name(cuda, bf16) == "varlen", "no shape: nothing to check triton against"
    assert default_backend_name(CPU, torch.float32, AttentionShape(16, 8, 128)) == "sdpa"
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert default_backend_name(cuda, bf16, AttentionShape(16, 8, 128, True)) == "varlen"
    monkeypatch.setattr(attention, "varlen_available", lambda: False)
    assert default_backend_name(cuda, bf16, AttentionShape(12, 12, 80)) == "sdpa"


def test_a_profile_naming_triton_serves_windowed_and_biased_models_too(monkeypatch):
    """A profile naming triton gives triton to a plain model and to one with a sliding window, with no warning;
    one naming a backend that refuses the model (FlashInfer and a sliding window) falls back to the default,
    with a warning."""
    from rose import attention
    from rose.attention import triton_varlen
    from rose.attention.triton_varlen import TritonBackend

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    monkeypatch.setattr(attention, "varlen_available", lambda: True)
    if triton_varlen.triton is None:
        monkeypatch.setattr(triton_varlen, "triton", SimpleNamespace())
    cuda, warnings = torch.device("cuda"), []
    monkeypatch.setattr(attention.log, "warning", lambda *a, **k: warnings.append(a[0] % a[1:] if a[1:] else a[0]))
    profile = ServingProfile({128: "triton", 4096: "triton"})
    plain = make_backend("auto", cuda, torch.bfloat16, shape=AttentionShape(16, 8, 128, True), profile=profile)
    assert isinstance(plain, TritonBackend) and not warnings
    windowed = make_backend("auto", cuda, torch.bfloat16, shape=AttentionShape(16, 8, 128, True, window=255),
                            profile=profile)
    assert isinstance(windowed, TritonBackend) and not warnings
    from rose.attention import flashinfer
    refused = ServingProfile({128: "flashinfer-fa3", 4096: "flashinfer-fa3"})
    monkeypatch.setattr(flashinfer, "FlashInferBackend", _refuses_windows, raising=False)
    backend = make_backend("auto", cuda, torch.bfloat16, shape=AttentionShape(16, 8, 128, True, window=255),
                           profile=refused)
    assert isinstance(backend, TritonBackend) and len(warnings) == 1 and "window" in warnings[0]


def _refuses_windows(device, dtype, shape, variant):
    """FlashInfer's constructor as it answers a windowed shape (the package itself is not installed here)."""
    from rose.attention import AttentionBackendError

    raise AttentionBackendError(f"attention 'flashinfer-{variant}' does not plan sliding-window layers here")


def test_auto_reads_the_profile_for_a_gpu_and_survives_a_broken_one(tmp_path, caplog):
    """The profile path of auto for a CUDA device in bf16, built (never run) on any machine."""
    from rose.attention import varlen

    spec = SimpleNamespace(model_dir=tmp_path, arch="qwen3", causal=False,
                           config={"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "hidden_size": 256})
    cuda = torch.device("cuda", 0)
    (tmp_path / "rose_profile.json").write_text("{broken")
    with caplog.at_level("WARNING", logger="rose.attention"):
        backend = make_backend("auto", cuda, torch.bfloat16, spec)
    assert backend.name in ("sdpa", "varlen") and "ignoring the serving profile" in caplog.text
    ServingProfile({128: "sdpa", 4096: "varlen", 8192: "flashinfer-fa3"}, {"causal": True}).save(
        tmp_path / "rose_profile.json")
    caplog.clear()
    with caplog.at_level("WARNING", logger="rose.attention"):
        backend = make_backend("auto", cuda, torch.bfloat16, spec)
    if torch.cuda.is_available() or varlen._varlen_attn is None:
        return  # on a GPU flashinfer may really run; without torch varlen the fallback differs
    # no CUDA here: flashinfer-fa3 falls back to varlen's fallback (sdpa: varlen needs a GPU to be the default)
    assert isinstance(backend, PerBucketBackend) and backend.profile.attention == {
        128: "sdpa", 4096: "varlen", 8192: "sdpa"}
    assert "flashinfer-fa3" in caplog.text and "measured with causal=True" in caplog.text


def test_build_kernels_cli_needs_a_gpu(tmp_path, capsys, monkeypatch):
    from rose.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setattr(os, "environ", dict(os.environ))  # --cache-dir sets variables: keep them here
    assert main(["build-kernels", str(tmp_path), "--cache-dir", str(tmp_path / "cache")]) == 1
    assert "no CUDA device" in capsys.readouterr().err


# -- on the GPU ---------------------------------------------------------------------------------------------
def on_gpu(test):
    return pytest.mark.gpu(pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")(test))


SLOW_JIT = os.environ.get("ROSE_TEST_SLOW_JIT") == "1"
GPU_BACKENDS = ["varlen", "flashinfer-fa2", "triton"] + (["flashinfer-fa3", "fa4"] if SLOW_JIT else [])


def gpu_backend(name, shape):
    try:
        return make_backend(name, torch.device("cuda"), torch.bfloat16, shape=shape)
    except AttentionBackendError as exc:
        pytest.skip(f"{name} cannot run here: {exc}")


def reference(q, k, v, lengths, shape):
    from benchmarks.attention_ab import reference as ref

    return ref(q, k, v, lengths, shape)


@on_gpu
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_backend_matches_float32_reference_on_ragged_padded_batches(name, causal):
    shape = AttentionShape(16, 8, 128, causal)
    backend = gpu_backend(name, shape)
    gen = torch.Generator(device="cuda").manual_seed(0)
    for lengths, layout in (([37, 1, 200, 64], MetaLayout(384, 8, 4)), ([512], MetaLayout(512, 1, 1)),
                            ([5, 300, 77], None)):
        meta = meta_for(lengths, layout, "cuda", graph=layout is not None)
        t = meta.layout.tokens
        q, k, v = (torch.randn(t, h, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for h in (16, 8, 8))
        backend.plan(meta)
        out = backend.forward(q, k, v, meta, causal, shape.scale, backend.prepare(meta, causal))
        real = sum(lengths)
        err = float((out[:real].float() - reference(q, k, v, lengths, shape)[:real]).abs().max())
        assert err < 0.03 and bool(torch.isfinite(out).all()), (lengths, err)


@on_gpu
@pytest.mark.parametrize("causal", [False, True])
def test_triton_graph_replays_new_batches_of_its_layout(causal):
    """The kernel reads each sequence's bounds from cu_seqlens on the device: a graph captured on one batch
    answers later batches of the same layout (other lengths, K/V strided views of one buffer, GQA) as the
    float32 reference does."""
    shape = AttentionShape(16, 8, 128, causal)
    backend = gpu_backend("triton", shape)
    for layout in (MetaLayout(512, 8, 8, max_seqlen=512), MetaLayout(128, 2, 2)):
        static = torch.zeros(layout.words, dtype=torch.int64, device="cuda")
        q = torch.randn(layout.tokens, 16, 128, device="cuda", dtype=torch.bfloat16)
        kv = torch.randn(layout.tokens, 16, 128, device="cuda", dtype=torch.bfloat16)
        k, v = kv[:, :8], kv[:, 8:]
        first = [layout.tokens // 2]
        static.copy_(torch.from_numpy(pack_batch(Batch.from_sequences([[1] * first[0]]), layout).packed))
        meta = ForwardMeta.from_buffer(static, layout, layout.seqlen_bound, None, graph=True)
        backend.forward(q, k, v, meta, causal, shape.scale)  # warm-up: compiles the kernel
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = backend.forward(q, k, v, meta, causal, shape.scale)
        news = ([10, 200, 3, 150, 40], [256, 255], [100, 100, 100, 1]) if layout.tokens == 512 else ([1], [127], [64, 64])
        for lengths in news:
            host = pack_batch(Batch.from_sequences([[1] * n for n in lengths]), layout)
            static.copy_(torch.from_numpy(host.packed))
            graph.replay()
            real = sum(lengths)
            err = float((out[:real].float() - reference(q, k, v, lengths, shape)[:real]).abs().max())
            assert err < 0.03, (layout, lengths, err)


@on_gpu
@pytest.mark.parametrize("name", ["flashinfer-fa2"] + (["flashinfer-fa3"] if SLOW_JIT else []))
def test_flashinfer_replans_between_graph_replays(name):
    """Capture on one batch, then re-plan other batches of the same layout (and another layout between)."""
    shape = AttentionShape(16, 8, 128, False)
    backend = gpu_backend(name, shape)
    layout = MetaLayout(512, 8, 8, max_seqlen=256)  # as rose.graphs keys it: no (pseudo-)sequence over 256
    static = torch.zeros(layout.words, dtype=torch.int64, device="cuda")
    qkv = [torch.randn(512, h, 128, device="cuda", dtype=torch.bfloat16) for h in (16, 8, 8)]
    first = pack_batch(Batch.from_sequences([[1] * 250, [1] * 250]), layout)
    static.copy_(torch.from_numpy(first.packed))
    meta = ForwardMeta.from_buffer(static, layout, layout.seqlen_bound, first, graph=True)
    backend.plan(meta)
    backend.forward(*qkv, meta, False, shape.scale)  # warm-up, as the graph runner's eager run
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.forward(*qkv, meta, False, shape.scale)
    other = meta_for([100, 30, 300], MetaLayout(1024, 4, 3), "cuda")  # a second layout planned in between
    for lengths in ([10, 200, 3, 150, 40], [256, 256], [100, 100, 100]):
        host = pack_batch(Batch.from_sequences([[1] * n for n in lengths]), layout)
        static.copy_(torch.from_numpy(host.packed))
        meta.host = host
        backend.plan(meta)
        graph.replay()
        backend.plan(other)
        real = sum(lengths)
        err = float((out[:real].float() - reference(*qkv, lengths, shape)[:real]).abs().max())
        assert err < 0.03, (lengths, err)


@on_gpu
@pytest.mark.parametrize("attention", ["flashinfer-fa2", "profile"])
def test_engine_graphs_match_eager_with_flashinfer(attention, tiny_root):
    from rose_tiny_models import build_qwen3_06b_shape

    from rose.engine import Engine

    tiny = build_qwen3_06b_shape(tiny_root, bidirectional=True)
    gpu_backend("flashinfer-fa2", AttentionShape(16, 8, 128))
    if attention == "profile":
        ServingProfile({128: "sdpa", 512: "varlen", 32768: "flashinfer-fa2"}).save(tiny.path / "rose_profile.json")
    try:
        engine = Engine.from_pretrained(tiny.path, device="cuda", attention="auto" if attention == "profile" else attention,
                                        prewarm=[(128, 1), (512, 4), (1024, 4)], graph_manifest=None,
                                        persistent_decoder="off")  # the 0.6B's shape: else 128 tokens are the kernel's
        verified = engine.warmup()  # captures each key and compares replay with eager (GraphVerificationError)
        assert len(verified) == 3 and max(v.max_divergence for v in verified) <= 1e-3
        if attention == "profile":
            assert engine.info.attention_backend == "profile(sdpa<=128,varlen<=512,flashinfer-fa2<=32768)"
        engine.close()
    finally:
        (tiny.path / "rose_profile.json").unlink(missing_ok=True)


