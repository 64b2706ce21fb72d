"""--input ids: the client tokenizes the very texts it would send and posts their token ids."""

from __future__ import annotations

import json
from pathlib import Path

from stack_bench_fake import MODEL, FakeStack

from benchmarks.stack.__main__ import main
from rose.tokenizer import Tokenizer

SHORT = ["--requests", "2", "--warmup-requests", "1", "--distinct-inputs", "2", "--duration-s", "5",
         "--skip-verify", "true", "--dump-inputs", "true"]


def test_ids_are_the_tokenizers_ids_of_the_same_texts(fake_stack: FakeStack, minilm_dir: Path, tmp_path: Path) -> None:
    fake_stack.received_ids.clear()
    before = fake_stack.hits.copy()
    argv = ["--url", fake_stack.url, "--model", MODEL, "--out", str(tmp_path), "--tokenizer", str(minilm_dir),
            "--suite", "embed-latency,score-latency", "--embed-tokens", "16,32", "--score-documents", "2",
            "--score-doc-tokens", "24", "--input", "ids", *SHORT]
    assert main(argv) == 0
    result = json.loads((tmp_path / f"stack_{MODEL}.json").read_text())
    dumped = json.loads((tmp_path / f"stack_{MODEL}_inputs.json").read_text())
    texts = [req["texts"][0] for step in dumped["embed-latency"].values() for req in step]
    for req in dumped["score-latency"]["2"]:
        texts += [req["query"], *req["texts"]]
    expected = {tuple(fake_stack.token_ids(t)) for t in texts}  # the fake's tokenizer: MiniLM's, specials included
    assert {tuple(ids) for ids in fake_stack.received_ids} == expected
    gateway = Tokenizer.from_dir(minilm_dir)  # and what Ivy makes of the same texts (no prompt: MiniLM has none)
    assert {tuple(e.ids) for e in gateway.encode_batch(texts)} == expected
    assert (fake_stack.hits - before)["/v1/rerank"] == 0  # scoring: one /v1/embeddings id batch
    by = {(r["suite"], r["param"]): r for r in result["records"]}
    assert by[("embed-latency", 16)]["tokens_per_request"] == 16 and by[("embed-latency", 32)]["input"] == "ids"
    score = by[("score-latency", 2)]
    assert score["tokens_per_request"] == 32 + 2 * 24 and score["items_per_request"] == 2
    assert score["route"].startswith("/v1/embeddings, query + documents as one token-id batch")
    assert result["env"]["inputs"]["input"] == "ids"


def test_ids_without_a_tokenizer_is_a_configuration_error(fake_stack: FakeStack, tmp_path: Path) -> None:
    argv = ["--url", fake_stack.url, "--model", MODEL, "--out", str(tmp_path), "--input", "ids", *SHORT]
    assert main(argv) == 2
