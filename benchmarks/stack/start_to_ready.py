"""`ivy up`'s start to ready, by what the replica finds of its Triton kernels: nothing (a fresh machine), the
kernel manifest its last start recorded beside the model with an empty cache (a new pod on a new node, the
variants compiled ahead in worker processes: rose.kernel_ahead), or the cache kept (a restarted pod). On the GPU:

    python -m benchmarks.stack.start_to_ready --model-dir DIR [--runs fresh,manifest,kept,manifest] [--json FILE]

Each run starts `ivy up` with TRITON_CACHE_DIR on a directory of this benchmark's (emptied for `fresh` and
`manifest`; `fresh` also removes the manifest), times it to the gateway's /ready, and stops it (SIGTERM, so the
replica records what it compiled). Prints one line per run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.stack.up_stack import UpStack
from rose.kernel_manifest import MANIFEST_NAME, read_entries


def variants(model_dir: Path) -> int:
    path = model_dir / MANIFEST_NAME
    return len(read_entries([path])) if path.is_file() else 0


def ahead_report(log_path: Path) -> str | None:
    """The replica's "Triton kernels compiled ahead" report (rose.engine's log line), if it had one."""
    try:
        lines = [line for line in log_path.read_text(errors="replace").splitlines() if "compiled ahead:" in line]
    except OSError:
        return None
    return lines[-1].split("compiled ahead:", 1)[1].strip() if lines else None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--runs", default="fresh,manifest,kept,manifest")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    model = Path(args.model_dir)
    work = Path(tempfile.mkdtemp(prefix="start_to_ready_"))
    cache = work / "triton"
    records = []
    for i, label in enumerate(args.runs.split(",")):
        if label in ("fresh", "manifest"):
            shutil.rmtree(cache, ignore_errors=True)
        if label == "fresh":
            (model / MANIFEST_NAME).unlink(missing_ok=True)
        before = variants(model)
        stack = UpStack(str(model), work / f"up_{i}_{label}.log", startup_timeout_s=240,
                        env={"TRITON_CACHE_DIR": str(cache), "TULIP_GRAPH_MANIFEST": "off"})
        started = time.monotonic()
        try:
            stack.start()
        finally:
            stack.stop()
        record = {"run": label, "ready_s": stack.ready_s, "stop_s": round(time.monotonic() - started, 2),
                  "manifest_variants_before": before, "manifest_variants_after": variants(model),
                  "cubins_after": sum(1 for _ in cache.rglob("*.cubin")), "ahead": ahead_report(stack.log_path)}
        records.append(record)
        print(f"start_to_ready {label}: " + ", ".join(f"{k} {v}" for k, v in record.items() if k != "run"), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
