"""The benchmark end to end against the fake stack: schema, ordering, skips, verification, plots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from stack_bench_fake import MODEL, REPO, FakeStack

from benchmarks.stack.__main__ import EXIT_SERVER, EXIT_VERIFY, main
from benchmarks.stack.verify import default_probes, write_reference

TINY = ["--duration-s", "5", "--requests", "3", "--warmup-requests", "1", "--distinct-inputs", "2",
        "--score-documents", "2,3", "--throughput-processes", "2", "--throughput-batch", "5",
        "--concurrency-levels", "1,2", "--gpu-hour-price", "3.5", "--gpus", "1"]
NUMBERS = ("p50_ms", "p95_ms", "p99_ms", "rps", "tokens_per_s")


def _reference(stack: FakeStack, path: Path, damage: float = 0.0, probe: int = 3) -> Path:
    probes = default_probes()
    matrix = stack.embed(probes)
    if damage:  # rotate one probe so that 1 - cos equals `damage`
        other = np.random.default_rng(1).standard_normal(matrix.shape[1])
        other -= other @ matrix[probe] * matrix[probe]
        other /= np.linalg.norm(other)
        cos = 1 - damage
        matrix[probe] = cos * matrix[probe] + np.sqrt(1 - cos**2) * other
    write_reference(path, probes, matrix, {"model": MODEL})
    return path


def _run(stack: FakeStack, out: Path, *extra: str, reference: Path | None = None) -> int:
    argv = ["--url", stack.url, "--model", MODEL, "--out", str(out), *TINY, *extra]
    if reference is not None:
        argv += ["--reference", str(reference)]
    return main(argv)


@pytest.fixture(scope="module")
def full_run(fake_stack: FakeStack, minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("results")
    ref = _reference(fake_stack, out / "ref.json")
    before = fake_stack.hits.copy()
    code = _run(fake_stack, out, "--suite", "all", "--tokenizer", str(minilm_dir), "--dump-inputs", "true",
                reference=ref)
    assert code == 0
    result = json.loads((out / f"stack_{MODEL}.json").read_text())
    return {"out": out, "result": result, "hits": fake_stack.hits - before}


def test_records_follow_the_schema(full_run: dict[str, Any]) -> None:
    records = full_run["result"]["records"]
    assert {r["suite"] for r in records} == {"embed-latency", "score-latency", "throughput", "concurrency"}
    for record in records:
        assert isinstance(record["param"], int)
        for key in NUMBERS:
            assert isinstance(record[key], float) and record[key] > 0, (record["suite"], key)
        assert record["p50_ms"] <= record["p95_ms"] <= record["p99_ms"]
        assert record["errors"] == 0 and record["requests"] >= 1
        assert record["cost_per_million_embeddings_usd"] > 0 and record["cost_per_million_tokens_usd"] > 0
    params = {s: [r["param"] for r in records if r["suite"] == s] for s in {r["suite"] for r in records}}
    assert params == {"embed-latency": [128, 512], "score-latency": [2, 3], "throughput": [5],
                      "concurrency": [1, 2]}


def test_over_long_steps_are_skipped_not_failed(full_run: dict[str, Any]) -> None:
    env = full_run["result"]["env"]
    assert env["server"]["max_length"] == 512 and env["server"]["max_length_source"] == "server"
    assert env["inputs"]["skipped"] == [{"suite": "embed-latency", "param": 4096,
                                         "reason": "4096 tokens is over the server's max length 512"}]


def test_token_counts_match_what_was_asked(full_run: dict[str, Any]) -> None:
    records = full_run["result"]["records"]
    by = {(r["suite"], r["param"]): r for r in records}
    # the fake server counts tokens with the same tokenizer: usage must equal the requested length
    assert by[("embed-latency", 128)]["tokens_per_request"] == 128
    assert by[("embed-latency", 512)]["tokens_per_request"] == 512
    assert by[("score-latency", 3)]["tokens_per_request"] == 32 + 3 * 512
    assert all(r["tokens_source"] == "usage" for r in records)
    dumped = json.loads((full_run["out"] / f"stack_{MODEL}_inputs.json").read_text())
    lengths = [req["tokens"] for client in dumped["concurrency"]["2"] for req in client]
    assert len(lengths) == 4 and all(16 <= n <= 512 for n in lengths)


def test_env_names_machine_inputs_and_verification(full_run: dict[str, Any]) -> None:
    env = full_run["result"]["env"]
    for key in ("timestamp", "hostname", "python", "git_commit", "torch", "config", "argv", "cost_basis"):
        assert key in env, key
    assert env["config"]["model"] == MODEL and env["config"]["suite"] == "all"
    assert env["inputs"]["tokenizer"]["kind"] == "exact"
    assert env["inputs"]["corpus"]["sha256"]
    assert env["server"]["verification"]["passed"] is True
    assert env["server"]["verification"]["max_divergence"] < 1e-6


def test_plots_are_written(full_run: dict[str, Any]) -> None:
    for name in ("latency_vs_concurrency", "saturation"):
        png = full_run["out"] / f"stack_{MODEL}_{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ours_scores_through_rerank(full_run: dict[str, Any]) -> None:
    assert full_run["hits"]["/v1/rerank"] > 0


def test_openai_style_scores_by_embeddings_only(fake_stack: FakeStack, tmp_path: Path) -> None:
    before = fake_stack.hits.copy()
    code = _run(fake_stack, tmp_path, "--suite", "score-latency", "--route-style", "openai",
                "--skip-verify", "true", "--label", "peer", "--score-doc-tokens", "64")
    assert code == 0
    assert (fake_stack.hits - before)["/v1/rerank"] == 0
    result = json.loads((tmp_path / f"stack_{MODEL}_peer.json").read_text())
    assert [r["param"] for r in result["records"]] == [2, 3]
    assert result["env"]["inputs"]["tokenizer"]["kind"] == "approximate"
    assert result["env"]["server"]["verification"] == {"skipped": True}


def test_verification_passes_small_divergence(fake_stack: FakeStack, tmp_path: Path) -> None:
    ref = _reference(fake_stack, tmp_path / "ref.json", damage=0.0005)
    assert _run(fake_stack, tmp_path, "--suite", "embed-latency", "--embed-tokens", "16", reference=ref) == 0


def test_verification_stops_the_run(fake_stack: FakeStack, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    ref = _reference(fake_stack, tmp_path / "ref.json", damage=0.002)
    assert _run(fake_stack, tmp_path, "--suite", "embed-latency", reference=ref) == EXIT_VERIFY
    assert "verification failed: 1 of 18 probes" in capsys.readouterr().err
    assert not list(tmp_path.glob("stack_*.json")), "no result after a failed verification"


def test_cli_exits_non_zero_on_a_wrong_reference(fake_stack: FakeStack, tmp_path: Path) -> None:
    probes = default_probes()
    wrong = np.random.default_rng(2).standard_normal((len(probes), 32))
    write_reference(tmp_path / "wrong.json", probes, wrong, {"model": "another"})
    proc = subprocess.run([sys.executable, "-m", "benchmarks.stack", "--url", fake_stack.url, "--model", MODEL,
                           "--out", str(tmp_path), "--reference", str(tmp_path / "wrong.json")],
                          cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == EXIT_VERIFY, proc.stderr
    assert "verification failed" in proc.stderr


def test_missing_reference_is_a_configuration_error(fake_stack: FakeStack, tmp_path: Path) -> None:
    assert _run(fake_stack, tmp_path, "--suite", "embed-latency") == 2


def test_a_failing_server_is_recorded_with_its_own_exit_code(fake_stack: FakeStack, tmp_path: Path) -> None:
    argv = ["--url", fake_stack.url, "--model", "broken", "--out", str(tmp_path), *TINY,
            "--suite", "concurrency", "--skip-verify", "true"]
    assert main(argv) == EXIT_SERVER
    records = json.loads((tmp_path / "stack_broken.json").read_text())["records"]  # written all the same
    assert [(r["suite"], r["param"]) for r in records] == [("concurrency", 1), ("concurrency", 2)]
    assert all("503" in r["error"] and r["p50_ms"] is None for r in records)


def test_an_unreachable_url_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--url", "http://127.0.0.1:9", "--model", MODEL, "--out", str(tmp_path), "--skip-verify", "true"]
    assert main(argv) == EXIT_SERVER
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
