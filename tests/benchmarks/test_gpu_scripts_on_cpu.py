"""The device scripts' own logic, checked here so that lent GPU time is not spent finding their bugs."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.rose_breakdown import category
from benchmarks.rose_gpu import VARIANTS, best_profile

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def test_kernel_names_fall_into_their_classes() -> None:
    names = {
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off": "gemm",
        "nvjet_tst_128x64_64x8_2x1_v_bz_coopA_NTN": "gemm",
        "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>, true>": "attention",
        "BatchPrefillWithRaggedKVCacheKernel": "attention",
        "_add_rms_kernel": "norm",  # rose/layers/fused.py's names
        "_qk_norm_rope_kernel": "norm",  # the fused QK-norm + rotary counts as a norm
        "_silu_mul_kernel": "activation",
        "_act_mul_kernel": "activation",  # SiLU or GELU-tanh times up
        "Memcpy HtoD (Pinned -> Device)": "copy",
        "decoder_kernel": "persistent",  # every layer of a small batch in one kernel (its phases: norms, GEMMs, ...)
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>": "other",
    }
    assert {n: category(n) for n in names} == names


def test_best_profile_prefers_the_causal_measurement(tmp_path: Path) -> None:
    for folder in ("qwen3-0.6b", "qwen3-0.6b-causal", "minilm-l6"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "rose_profile.json").write_text("{}")
    assert best_profile(tmp_path, "qwen3-0.6b", causal=True).parent.name == "qwen3-0.6b-causal"
    assert best_profile(tmp_path, "qwen3-0.6b", causal=False).parent.name == "qwen3-0.6b"
    assert best_profile(tmp_path, "minilm-l6", causal=True).parent.name == "minilm-l6"  # none causal: the other
    with pytest.raises(SystemExit):
        best_profile(tmp_path, "qwen3-4b", causal=True)
    assert "rose-best" in VARIANTS and "hf-compile" in VARIANTS


@pytest.mark.slow
def test_breakdown_runs_end_to_end_on_cpu(tmp_path: Path, monkeypatch) -> None:
    from benchmarks import rose_breakdown

    monkeypatch.setattr(sys, "argv", ["rose_breakdown", "--device", "cpu", "--models", "minilm-l6", "--tokens",
                                      "16,64", "--iters", "2", "--out", str(tmp_path), "--root", str(tmp_path / "m")])
    rose_breakdown.main()
    rows = json.loads((tmp_path / "rose_breakdown.json").read_text())["rows"]
    assert [r["tokens"] for r in rows] == [16, 64]
    assert all(r["host_to_host_p50_ms"] > 0 and r["weight_bytes"] > 0 for r in rows)


def _bash(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", *args], check=False, capture_output=True, text=True, timeout=60, env=env)


def test_every_device_script_parses_and_is_named_by_what_it_measures() -> None:
    scripts = sorted(BENCHMARKS.glob("*.sh"))
    assert {"device.sh", "device_env.sh"} <= {s.name for s in scripts}
    for script in scripts:
        assert _bash("-n", str(script)).returncode == 0, script.name
        assert not re.search(r"session|run\d|\d{4}-\d\d", script.name), script.name


def test_device_sh_lists_every_device_script_one_line_each() -> None:
    listing = _bash(str(BENCHMARKS / "device.sh"))
    assert listing.returncode == 0, listing.stderr
    rows = listing.stdout.splitlines()[1:]
    names = [row.split()[0] for row in rows]
    assert len(names) == len(set(names)) and {"gpu-tests", "engine", "stack", "fa4-1", "fa4-2"} <= set(names)
    table = (BENCHMARKS / "device.sh").read_text()
    for script in BENCHMARKS.glob("*_device.sh"):  # each one reachable: in the table or found by its name
        assert f"|{script.name}|" in table or script.stem.removesuffix("_device").replace("_", "-") in names
        assert script.read_text().splitlines()[1].startswith("#"), f"{script.name}: no one-line summary"
    missing = [row.split()[0] for row in rows if "is not in this tree" in row]
    assert set(missing) <= {"stack-layers"}  # written elsewhere; dispatched once it exists


def _sandbox(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """device.sh and device_env.sh in a tree of their own (no .whl: nothing installed), with probe scripts."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    for name in ("device.sh", "device_env.sh"):
        shutil.copy(BENCHMARKS / name, bench / name)
    probe = ('#!/usr/bin/env bash\n# prints the environment it was given\nset -u\n'
             'source "$(dirname "$0")/device_env.sh" || exit 1\n'
             'echo "pwd=$PWD path=$PYTHONPATH unbuffered=$PYTHONUNBUFFERED out=$OUT budget=$BUDGET step=${STEP:-}"\n')
    (bench / "probe_env_device.sh").write_text(probe)
    (bench / "fa4_device.sh").write_text(probe + "exit 3\n")
    (bench / "needs_wheels_device.sh").write_text(probe.replace("echo", "require_carried .whl\necho"))
    env = {k: v for k, v in os.environ.items()
           if k not in ("OUT", "PYTHONPATH", "DEVICE_ENV_READY", "BUDGET", "STEP", "GIT_COMMIT")}
    env["OUT"] = str(tmp_path / "out")
    return bench, env


def test_device_sh_sets_the_environment_and_runs_each_named_script_in_turn(tmp_path: Path) -> None:
    bench, env = _sandbox(tmp_path)
    run = _bash(str(bench / "device.sh"), "probe-env", "fa4-2", "probe-env", env=env)
    assert run.returncode == 3, run.stderr  # the first failing script's status; the rest still ran
    probes = [line for line in run.stdout.splitlines() if line.startswith("pwd=")]
    assert len(probes) == 3
    for line in probes:
        assert line.startswith(f"pwd={tmp_path} path=/tmp/site:{tmp_path} unbuffered=1 out={tmp_path / 'out'} ")
    assert probes[1].endswith("step=2") and probes[0].endswith("step=")
    budgets = [int(line.split("budget=")[1].split()[0]) for line in probes]
    assert 560 <= budgets[2] <= budgets[1] <= budgets[0] <= 570
    assert (tmp_path / "out").is_dir()


def test_device_sh_checks_every_name_before_running_anything(tmp_path: Path) -> None:
    bench, env = _sandbox(tmp_path)
    run = _bash(str(bench / "device.sh"), "probe-env", "no-such-run", env=env)
    assert run.returncode == 2 and "pwd=" not in run.stdout
    assert "no run named 'no-such-run'" in run.stderr and "probe-env" in run.stderr  # the list follows
    run = _bash(str(bench / "device.sh"), "stack-layers", env=env)
    assert run.returncode == 2 and "stack_layers_device.sh" in run.stderr


def test_a_script_that_needs_carried_wheels_says_so(tmp_path: Path) -> None:
    bench, env = _sandbox(tmp_path)
    run = _bash(str(bench / "device.sh"), "needs-wheels", env=env)
    assert run.returncode == 1 and "pwd=" not in run.stdout and "carry .whl" in run.stderr


def test_express_inprocess_runs_its_variants_on_cpu(tmp_path: Path, minilm_dir: Path) -> None:
    """On a CPU there is no express lane: alone, bulk-alone and main run, each with its counts."""
    from benchmarks import express_inprocess

    assert express_inprocess.main(["--model-dir", str(minilm_dir), "--device", "cpu", "--seconds", "0.3",
                                   "--bulk-docs", "2", "--doc-tokens", "32", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "express_inprocess.json").read_text())
    got = {r["variant"]: r for r in data["records"]}
    assert list(got) == ["alone", "bulk-alone", "main"] and data["env"]["commit"]
    assert got["alone"]["queries"] > 0 and got["alone"]["bulk_tokens_per_s"] == 0
    assert got["bulk-alone"]["queries"] == 0 and got["bulk-alone"]["bulk_tokens_per_s"] > 0
    assert got["main"]["queries"] > 0 and got["main"]["bulk_tokens_per_s"] > 0


def test_step_host_times_every_phase_on_cpu(tmp_path: Path, minilm_dir: Path) -> None:
    """benchmarks.step_host walks ModelRunner.step()'s own phases (a renamed phase fails here, not on the
    device) and writes every phase for every shape."""
    from benchmarks.step_host import PHASES
    from benchmarks.step_host import main as step_host

    out = tmp_path / "step_host.json"
    assert step_host(["--model-dir", str(minilm_dir), "--iters", "3", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert set(results) == {"1x128", "1x512", "8x128", "16-docs"}
    for phases in results.values():
        assert set(phases) == set(PHASES)
        assert phases["pack"]["p50_us"] > 0 and phases["host_to_host"]["p50_us"] >= phases["step"]["p50_us"]


def test_ivy_text_path_times_text_and_ids_through_the_app(capsys) -> None:
    """benchmarks.ivy_text_path drives the ASGI app with a zero-cost pool: both variants answer 200 and print."""
    from benchmarks import ivy_text_path

    assert ivy_text_path.main(["--rounds", "1", "--per-round", "10"]) == 0
    out = capsys.readouterr().out
    assert "text " in out and "ids " in out and "text - ids" in out


def test_every_persistent_decoder_sweep_row_fits_the_0_6b_and_tiles_parse() -> None:
    """A row whose tiles the 0.6B's shapes do not divide would only fail on the device, costing its call."""
    pytest.importorskip("triton")
    from benchmarks.model_zoo import QWEN3_CONFIGS
    from benchmarks.persistent_decoder import SWEEP, sweep_rows, tile_changes
    from rose.layers.persistent_tiles import fit_tiles

    cfg = QWEN3_CONFIGS["qwen3-0.6b"]
    d = cfg["head_dim"]
    shape = (cfg["hidden_size"], (cfg["num_attention_heads"] + 2 * cfg["num_key_value_heads"]) * d,
             cfg["num_attention_heads"] * d, cfg["intermediate_size"])
    fitted = fit_tiles(*shape)
    for tokens, changes in SWEEP:
        assert tokens in (16, 32, 64, 128)
        dataclasses.replace(fitted, **changes).check(*shape)
    assert tile_changes("o=64,down=64,split_od=8,prefetch=Idle,heads=0,barrier=counter") == {
        "o": 64, "down": 64, "split_od": 8, "prefetch": "idle", "heads": False, "barrier": "counter"}
    for bad in ("width=64", "o", "o=", "o=6x", "heads=yes", "prefetch=true", "barrier=spin"):
        with pytest.raises(SystemExit, match="--tiles"):
            tile_changes(bad)
    # --sweep: rows by field, or by a field's value
    assert sweep_rows("") == SWEEP
    assert {t for t, c in sweep_rows("prefetch=first")} == {16, 32, 64, 128}
    assert all(c["prefetch"] == "first" for _, c in sweep_rows("prefetch=first"))
    assert len(sweep_rows("prefetch")) > len(sweep_rows("prefetch=first")) > 0
    assert sweep_rows("stages=5,barrier=counter") == [r for r in SWEEP if r[1].get("stages") == 5
                                                        or r[1].get("barrier") == "counter"]


def test_the_attention_sweep_reads_its_shapes_as_sequences_by_length() -> None:
    from benchmarks.triton_attention_sweep import parse_shape

    assert parse_shape("2x4096") == [4096, 4096]
    assert parse_shape("1x128") == [128]
    assert parse_shape("100-docs") is None and parse_shape(" 4x1024") == [1024] * 4
    for bad in ("4096", "0x512", "2x0", "2x"):
        with pytest.raises(SystemExit, match="SEQSxLEN"):
            parse_shape(bad)


def test_http_floor_times_uvicorn_and_a_bare_httptools_protocol(capsys) -> None:
    """benchmarks.http_floor: both servers answer whole keep-alive round trips and get a row each."""
    from benchmarks import http_floor

    assert http_floor.main(["--requests", "50", "--repeat", "1"]) == 0
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:]}
    assert set(rows) == {"uvicorn", "httptools"} and all(float(v[0]) > 0 for v in rows.values())


def test_overhead_runs_its_phases_with_warm_cores_and_stops_the_loops() -> None:
    """benchmarks.overhead --warm-cores: every phase measured, and no warm-cores loop left running afterwards. In a
    process of its own, as it is run (its asyncio.run calls would leave this one's main thread without a loop)."""
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "benchmarks.overhead", "--requests", "20", "--concurrency", "2",
                           "--duration-s", "0.5", "--repeat", "1", "--warm-cores"], cwd=repo, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "warm cores" in out and all(p in out for p in ("grpc-seq", "http-seq", "http-conc", "http-health"))
    left = subprocess.run(["pgrep", "-f", "ivy.warm_cores"], capture_output=True, text=True).stdout.split()
    assert not left, left
