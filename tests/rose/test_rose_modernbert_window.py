"""ModernBERT's local layers: through the backend's bidirectional sliding window when it has one, else the
banded path; both against transformers on the CPU in float32. Which backends say they have that window.

The tiny ModernBERT has 4 layers, every third global: layers 1 and 2 are local (window 8 each way), so a
forward on the window path makes two windowed backend calls and no banded one, the fallback the reverse.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from rose_parity import cosine, random_seqs, reference_rows

from rose import Batch
from rose.attention.base import AttentionBackend
from rose.attention.flashinfer import FlashInferBackend
from rose.attention.profile import PerBucketBackend, ServingProfile
from rose.attention.sdpa import SdpaBackend
from rose.attention.varlen import VarlenBackend
from rose.meta import ForwardMeta, MetaLayout

LOCAL_LAYERS = 2
# SDPA's CPU layouts: one padded block, equal lengths (a [S, L] view), one sequence alone; all past the window
LENGTHS = {"padded": [64, 40, 5, 17], "uniform": [30, 30, 30], "single": [50]}


def _embed_exact(engine, seqs):
    return engine.embed(seqs)


def _embed_as_a_graph(engine, seqs):
    """Padded to a bucket layout without host metadata, as a CUDA graph runs it (SDPA's device-side mask)."""
    batch = Batch.from_sequences(seqs, engine.spec.pooling)
    host = engine.runner.pack(batch, MetaLayout(tokens=192, seqs=8, rows=8, max_seqlen=192))
    meta = ForwardMeta.from_buffer(torch.from_numpy(host.packed), host.layout, host.layout.seqlen_bound)
    with torch.inference_mode():
        return engine.runner.forward(meta)[: batch.num_rows].numpy()


RUNS = {"exact": _embed_exact, "as-a-graph": _embed_as_a_graph}


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("layout", LENGTHS)
def test_sdpa_runs_the_local_layers_through_its_window(layout, run, encoder_models, engine_of,
                                                       local_attention_paths):
    tiny, engine = encoder_models["modernbert"], engine_of("modernbert")
    assert isinstance(engine.runner.backend, SdpaBackend) and engine.runner.backend.bidirectional_window
    paths = local_attention_paths(engine.runner.backend)
    seqs = random_seqs(tiny, LENGTHS[layout], seed=13)
    ours = RUNS[run](engine, seqs)
    assert paths == ["window"] * LOCAL_LAYERS
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999


@pytest.mark.parametrize("run", RUNS)
def test_a_backend_without_the_window_takes_the_banded_path(run, encoder_models, engine_of, local_attention_paths,
                                                            monkeypatch):
    tiny, engine = encoder_models["modernbert"], engine_of("modernbert")
    monkeypatch.setattr(engine.runner.backend, "bidirectional_window", False)
    paths = local_attention_paths(engine.runner.backend)
    seqs = random_seqs(tiny, LENGTHS["padded"], seed=13)
    ours = RUNS[run](engine, seqs)
    assert paths == ["banded"] * LOCAL_LAYERS
    assert cosine(ours, reference_rows(tiny, seqs)).min() >= 0.9999


def test_which_backends_run_a_bidirectional_window():
    from rose.attention import varlen

    assert not AttentionBackend.bidirectional_window  # a backend says so itself
    assert SdpaBackend(torch.device("cpu")).bidirectional_window
    assert VarlenBackend.bidirectional_window == ("window_size" in varlen._PARAMS)
    assert not FlashInferBackend.bidirectional_window


@pytest.mark.parametrize("has_window", [True, False])
def test_fa4_runs_the_window_when_its_function_takes_window_size(has_window, monkeypatch):
    import rose.attention.fa4 as fa4

    def attn(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, softmax_scale=None, causal=False, window_size=None):
        raise AssertionError("not called")

    params = [p for p in inspect.signature(attn).parameters.values() if has_window or p.name != "window_size"]
    attn.__signature__ = inspect.Signature(params)
    monkeypatch.setattr(fa4, "check_supported", lambda device, dtype, shape: None)
    monkeypatch.setattr(fa4, "import_fa4", lambda: attn)
    assert fa4.Fa4Backend(torch.device("cuda"), torch.bfloat16).bidirectional_window is has_window


class _Windowed(AttentionBackend):
    def __init__(self, name: str, windowed: bool) -> None:
        self.name, self.bidirectional_window = name, windowed


@pytest.mark.parametrize("windowed, expected", [((True, True), True), ((True, False), False)])
def test_per_bucket_dispatch_runs_the_window_only_when_every_backend_does(windowed, expected):
    backends = {"a": _Windowed("a", windowed[0]), "b": _Windowed("b", windowed[1])}
    per_bucket = PerBucketBackend(ServingProfile({128: "a", 4096: "b"}), backends)
    assert per_bucket.bidirectional_window is expected
