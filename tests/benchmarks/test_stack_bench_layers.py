"""The layers driver end to end on the CPU: the fake stack (HTTP), the fake Tulip (gRPC) and ROSE
in-process on the bundled MiniLM, one run, one file, one plot; failures recorded, files kept."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from bench_fake_tulip import start_fake_tulip
from stack_bench_fake import MODEL, FakeStack
from test_stack_bench_server_counters import metrics_url  # noqa: F401 - the fixture

import benchmarks.stack.layers as layers
from benchmarks.stack.__main__ import EXIT_SERVER

TINY = ["--duration-s", "5", "--requests", "2", "--warmup-requests", "1", "--distinct-inputs", "2",
        "--embed-tokens", "16", "--score-documents", "2", "--score-doc-tokens", "24", "--throughput-processes", "1",
        "--throughput-batch", "3", "--concurrency-levels", "2", "--doc-max-tokens", "64"]
NUMBERS = ("p50_ms", "p95_ms", "p99_ms", "rps", "tokens_per_s")
STEPS = [("embed-latency", 16), ("score-latency", 2), ("concurrency", 2)]  # throughput: as concurrency


def _argv(stack: FakeStack, model_dir: Path, out: Path, tulip: str, *extra: str) -> list[str]:
    return ["--url", stack.url, "--tulip", tulip, "--model-dir", str(model_dir), "--model", MODEL,
            "--out", str(out), "--skip-verify", "true", *TINY, *extra]


@pytest.fixture(scope="module")
def layers_run(fake_stack: FakeStack, minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("layers")
    tulip = start_fake_tulip(fake_stack)
    try:
        code = layers.main(_argv(fake_stack, minilm_dir, out, tulip.address, "--suite",
                                 ",".join(suite for suite, _ in STEPS),
                                 "--inprocess", "true", "--device", "cpu"))
        calls = tulip.servicer.calls.copy()
    finally:
        tulip.close()
    result = json.loads((out / f"stack_layers_{MODEL}.json").read_text())
    assert code == 0, [(r["layer"], r["suite"], r["error"]) for r in result["records"] if r.get("error")]
    return {"out": out, "result": result, "calls": calls}


def test_every_layer_runs_every_suite_in_order(layers_run: dict[str, Any]) -> None:
    records = layers_run["result"]["records"]
    assert [(r["layer"], r["suite"], r["param"]) for r in records] == [
        (layer, suite, param) for layer in ("ivy-text", "ivy-ids", "tulip-grpc", "tulip-framed", "inprocess")
        for suite, param in STEPS
    ] + [("inprocess-closed", suite, param) for suite, param in STEPS if suite == "concurrency"]
    for r in records:
        assert "error" not in r, r
        assert all(isinstance(r[k], float) and r[k] > 0 for k in NUMBERS), r
        assert r["input"] == ("text" if r["layer"] == "ivy-text" else "ids")
    assert layers_run["calls"]["EmbedStream"] >= 1 and layers_run["calls"]["Embed"] == 0  # stream by default
    assert layers_run["calls"]["framed-messages"] >= len(STEPS)  # tulip-framed: on the port Info names


def test_layers_send_the_same_requests(layers_run: dict[str, Any]) -> None:
    by: dict[tuple, set] = {}
    for r in layers_run["result"]["records"]:  # the fake counts tokens; ROSE's layer uses the client's count
        by.setdefault((r["suite"], r["param"]), set()).add(r["tokens_per_request"])
    assert by[("embed-latency", 16)] == {16.0} and by[("score-latency", 2)] == {32.0 + 2 * 24}
    assert all(len(v) == 1 for v in by.values()), by


def test_env_has_the_headline_facts_and_each_layers_server(layers_run: dict[str, Any]) -> None:
    env = layers_run["result"]["env"]
    assert list(env)[:4] == ["gpu", "driver", "torch", "commit"] and env["commit"]
    assert set(env["layers"]) == {"ivy-text", "ivy-ids", "tulip-grpc", "tulip-framed", "inprocess", "inprocess-closed"}
    assert env["layers"]["tulip-grpc"]["info"]["max_batch_tokens"] == 256
    assert env["layers"]["inprocess"]["engine"]["max_batch_tokens"] == 256  # Tulip's limits, from Info
    assert env["layers"]["ivy-ids"]["verification"] == {"skipped": True}


def test_the_plot_is_written(layers_run: dict[str, Any]) -> None:
    png = layers_run["out"] / f"stack_layers_{MODEL}.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_layer_that_cannot_start_is_recorded_and_the_run_goes_on(
        fake_stack: FakeStack, minilm_dir: Path, tmp_path: Path) -> None:
    argv = _argv(fake_stack, minilm_dir, tmp_path, "127.0.0.1:9", "--suite", "embed-latency,score-latency",
                 "--timeout-s", "2", "--layers", "tulip-grpc,ivy-ids")
    assert layers.main(argv) == EXIT_SERVER
    records = json.loads((tmp_path / f"stack_layers_{MODEL}.json").read_text())["records"]
    assert [(r["layer"], r["suite"]) for r in records] == [  # in the order named: the failing layer first
        ("tulip-grpc", "embed-latency"), ("tulip-grpc", "score-latency"),
        ("ivy-ids", "embed-latency"), ("ivy-ids", "score-latency")]
    assert all("could not start" in r["error"] and r["p50_ms"] is None for r in records[:2])
    assert all(r["p50_ms"] > 0 for r in records[2:])


def test_a_killed_run_keeps_the_layers_that_finished(fake_stack: FakeStack, minilm_dir: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def killed(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(layers, "tulip_server", killed)
    with pytest.raises(KeyboardInterrupt):
        layers.main(_argv(fake_stack, minilm_dir, tmp_path, "127.0.0.1:9", "--suite", "embed-latency",
                          "--layers", "ivy-text,tulip-grpc"))
    records = json.loads((tmp_path / f"stack_layers_{MODEL}.json").read_text())["records"]
    assert [(r["layer"], r["suite"]) for r in records] == [("ivy-text", "embed-latency")]


def test_server_counters_go_with_each_record(fake_stack: FakeStack, minilm_dir: Path, tmp_path: Path,
                                             metrics_url: str) -> None:
    argv = _argv(fake_stack, minilm_dir, tmp_path, "127.0.0.1:9", "--suite", "embed-latency",
                 "--layers", "ivy-ids", "--server-metrics", metrics_url)
    assert layers.main(argv) == 0
    (record,) = json.loads((tmp_path / f"stack_layers_{MODEL}.json").read_text())["records"]
    assert record["server"]["runs_replay"] == 2  # the measured requests only, not the warm-up


def test_the_servers_layers_run_in_the_order_named_and_in_process_last() -> None:
    """Which layer meets a fresh stack first is the caller's choice (`--layers ivy-ids,ivy-text`); the in-process
    layers always follow the servers' (they load the engine into this process)."""
    from benchmarks.stack.layers import LayersConfig, check

    def order(layers: str, **kw) -> list[str]:
        config = LayersConfig(model="m", tokenizer="t", model_dir="d", layers=layers, **kw)
        return check(config)[1]

    assert order("ivy-ids,ivy-text") == ["ivy-ids", "ivy-text"]
    assert order("inprocess,ivy-text,tulip-framed,ivy-text", tulip="h:1", inprocess=True) == [
        "ivy-text", "tulip-framed", "inprocess"]
    assert order("tulip-grpc,ivy-ids") == ["ivy-ids"]  # no --tulip: Tulip's layers are left out
