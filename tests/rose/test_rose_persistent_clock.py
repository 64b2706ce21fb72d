"""Every program's clock in the persistent decoder: the clocks the decoder takes (program 0's, or every
program's) and refuses, and benchmarks.persistent_clock's split of a step into skew, work, span and the barrier's
release, on clocks whose answers are known. (On the GPU: tests/rose/test_rose_persistent_decoder_gpu.py.)"""

from __future__ import annotations

import pytest
import torch


def _clock(starts: list[list[int]], works: list[list[int]], scale: int = 1) -> torch.Tensor:
    """[steps, programs, 4] from each step's starts and works in ns. Program p's SM counts RATES[p] cycles a ns from
    its own origin (SMs' counters neither agree nor run at one rate); step 0's end on program 1 reads 40 ns late in
    ns (%globaltimer's coarse ticks), not in cycles."""
    rows = []
    for i, (step_starts, step_works) in enumerate(zip(starts, works)):
        rows.append([[s * scale, (s + w + (40 if (i, p) == (0, 1) else 0)) * scale,
                      10_000 * p + int(RATES[p] * s * scale), 10_000 * p + int(RATES[p] * (s + w) * scale)]
                     for p, (s, w) in enumerate(zip(step_starts, step_works))])
    return torch.tensor(rows, dtype=torch.int64)


RATES = (2.0, 1.5, 3.0)


def test_a_step_splits_into_skew_work_span_and_release():
    from benchmarks.persistent_clock import per_kind, sm_ghz, split_steps

    starts, works = [[0, 100, 400], [2400, 2450, 2500]], [[1000, 2000, 500], [100, 200, 300]]
    runs = torch.stack([_clock(starts, works), _clock(starts, works), _clock(starts, works, scale=3)])  # an outlier
    steps = split_steps(runs)
    # µs. Work from each SM's cycles at its own rate (not from the late ns); span and release from the ns, the
    # late end included; the last step has no release. Program 1's rate over the forward reads 1.5 cycles a ns
    # since its last end is exact.
    expected = {"skew": [0.4, 0.1], "work p50": [1.0, 0.2], "work max": [2.0, 0.3], "work min": [0.5, 0.1],
                "span": [2.14, 0.4], "release": [0.26, 0.0], "step": [2.4, 0.4]}
    for stat, values in expected.items():
        assert steps[stat].tolist() == pytest.approx(values), stat

    assert sm_ghz(runs) == pytest.approx(2.0)  # the median of the SMs' rates (1.5, 2.0, 3.0 in every run)

    table = per_kind(steps, layers=1, names=["qkv"])
    assert list(table) == ["qkv", "final norm", "total"]
    assert table["qkv"]["release"] == pytest.approx(0.26) and table["final norm"]["span"] == pytest.approx(0.4)
    assert table["total"]["step"] == pytest.approx(2.8)


def test_the_decoder_takes_program_zeros_clock_or_every_programs(monkeypatch):
    from rose.layers import persistent_decoder
    from rose.layers.persistent_decoder import PersistentDecoder
    from rose.layers.persistent_tiles import Tiles
    from rose.models.qwen3 import Qwen3Model

    cfg = {"vocab_size": 50, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 1,
           "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32}
    tiles = Tiles(qkv=32, o=32, gate_up=32, down=32, split_qkv=2, split_od=2, k=16, keys=16, queries=16)
    decoder = PersistentDecoder(Qwen3Model(cfg, causal=True), tiles, programs=3)
    launched = []
    monkeypatch.setattr(persistent_decoder, "decoder_kernel", {(3,): lambda *a, **meta: launched.append(meta)})
    monkeypatch.setattr(persistent_decoder, "INTERPRETED", False)
    work = decoder.workspace(torch.zeros(8, 64), torch.arange(8), torch.zeros(8, dtype=torch.long))
    steps = decoder.steps(8)

    def run(clock, **kwargs):
        decoder.run(work, kwargs.pop("first", 0), steps, clock=clock, **kwargs)
        return launched[-1]["CLOCK"]

    assert run(None) == 0
    assert run(torch.zeros(steps + 1, dtype=torch.int64)) == 1
    assert run(torch.zeros(steps, 3, 4, dtype=torch.int64)) == 2
    count = len(launched)
    shapes = rf"\[{steps + 1}\] \(program 0's\) or \[{steps}, 3, 4\] \(every program's\)"
    for clock, kwargs, match in ((torch.zeros(steps, 2, 4, dtype=torch.int64), {}, shapes),
                                 (torch.zeros(steps, dtype=torch.int64), {}, shapes),
                                 (torch.zeros(steps + 1), {}, "int64"),
                                 (torch.zeros(2, steps + 1, dtype=torch.int64)[:, 0], {}, "strides"),
                                 (torch.zeros(steps + 1, dtype=torch.int64), {"persistent": False}, "step 0"),
                                 (torch.zeros(steps + 1, dtype=torch.int64), {"first": 1}, "step 0")):
        with pytest.raises(ValueError, match=match):
            run(clock, **kwargs)
    monkeypatch.setattr(persistent_decoder, "INTERPRETED", True)
    with pytest.raises(ValueError, match="interpreter"):
        run(torch.zeros(steps + 1, dtype=torch.int64))
    assert len(launched) == count  # nothing refused was launched
