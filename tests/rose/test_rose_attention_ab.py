"""The attention A/B's bookkeeping (benchmarks/attention_ab.py) on any machine: winner choice, records of
backends that cannot run, the serving profile it writes. The timing itself runs on the H200."""

from __future__ import annotations

import torch

from rose.attention import AttentionShape, ServingProfile

CPU = torch.device("cpu")


def test_ab_winner_is_the_fastest_accurate_backend():
    from benchmarks.attention_ab import make_profile, winners

    rows = [{"shape": "1x128", "tokens": 128, "backend": b, "us": us, "max_abs_err": err, "status": st, "causal": False}
            for b, us, err, st in (("sdpa", 30.0, 0.01, "ok"), ("varlen", 10.0, 0.01, "ok"),
                                   ("fa4", 5.0, 0.9, "ok"), ("flashinfer-fa3", None, None, "unavailable"))]
    assert winners(rows)["1x128"]["winner"] == "varlen", "fa4 is faster but wrong here: it cannot win"
    profile = make_profile("m", rows, {"gpu": "test"})
    assert set(profile.attention.values()) == {"varlen"} and profile.info["measured"][0]["shape"] == "1x128"


def test_ab_records_every_backend_and_writes_a_profile(monkeypatch, tmp_path):
    """The A/B's bookkeeping on a CPU: timing stubbed, real inputs and reference, a backend that cannot run."""
    import benchmarks.attention_ab as ab

    def fake_time(backend, case, shape):
        backend.plan(case.meta)
        out = backend.forward(case.q, case.k, case.v, case.meta, shape.causal, shape.scale,
                              backend.prepare(case.meta, shape.causal))
        return {"us": 1.0 if backend.name == "sdpa" else 2.0,
                "max_abs_err": float((out[: case.tokens].float() - case.ref).abs().max())}

    monkeypatch.setattr(ab, "time_in_graph", fake_time)
    monkeypatch.setattr(ab, "shapes", lambda quick: {"1x64": [64], "3-docs": [20, 5, 31]})
    records, first_use = [], []
    rows = ab.bench_model("tiny", AttentionShape(4, 2, 16, True), 40, ["sdpa", "fa4"], False, records, first_use, CPU)
    assert [(r["shape"], r["backend"], r["status"]) for r in rows] == [
        ("3-docs", "sdpa", "ok"), ("3-docs", "fa4", "unavailable")], "1x64 is longer than the model's 40 tokens"
    assert rows[0]["max_abs_err"] < 0.05 and {f["backend"] for f in first_use} == {"sdpa", "fa4"}
    profile = ab.make_profile("tiny", rows, {"gpu": "cpu"})
    assert set(profile.attention.values()) == {"sdpa"} and max(profile.attention) > max(ab.DEFAULT_TOKEN_BUCKETS)
    ServingProfile.load(profile.save(tmp_path / "rose_profile.json"))
