"""Whether torch's ragged cuDNN attention (`aten._cudnn_attention_forward` with cumulative lengths) can be captured in
a CUDA graph, and at what cost eagerly, beside torch's varlen (CUDA only; prints a short table last).

    python -m benchmarks.cudnn_capture_probe [--modes global,thread_local,relaxed | none] [--no-eager]

Run one capture mode per process where a failed capture can take the process down (torch 2.11 on the H200:
a segmentation fault in capture_end).

1. One eager call under `torch.cuda.set_sync_debug_mode("error")`: a host synchronization inside the op (a
   `.item()`, a device-to-host copy) raises with its place, the usual reason a capture is invalidated.
2. A capture in each of CUDA's three capture error modes (global, thread_local, relaxed), each after an eager
   warm-up of the same shapes; a capture that succeeds is replayed and compared with the float32 reference.
3. Eager µs per call (CUDA events, median of 50) of cuDNN and of torch's varlen at 128, 512 and 4096 tokens.
"""

from __future__ import annotations

import statistics
import traceback

import torch

from benchmarks.attention_ab import Case
from rose.attention import AttentionShape, make_backend

SHAPE = AttentionShape(16, 8, 128, causal=True)


def cudnn_call(case: Case):
    op = torch.ops.aten._cudnn_attention_forward.default
    k, v = (x.repeat_interleave(SHAPE.group, dim=1) for x in (case.k, case.v))
    cu, m = case.meta.cu_seqlens, case.meta.max_seqlen
    return lambda: op(case.q, k, v, None, cu, cu, m, m, False, 0.0, True, False, scale=SHAPE.scale)[0]


def eager_us(fn, iters: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
    return statistics.median(times)


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--modes", default="global,thread_local,relaxed")
    parser.add_argument("--no-eager", action="store_true", help="skip the eager timings")
    args = parser.parse_args()
    device = torch.device("cuda")
    case = Case([250, 250], SHAPE, device)
    run = cudnn_call(case)
    print("== eager call under sync debug mode 'error'")
    torch.cuda.set_sync_debug_mode("error")
    try:
        run()
        print("no host synchronization inside the op")
    except Exception:  # noqa: BLE001
        print(traceback.format_exc()[-1500:])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    rows = []
    for mode in [m for m in args.modes.split(",") if m not in ("", "none")]:
        run()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode=mode):
                out = run()
            graph.replay()
            torch.cuda.synchronize()
            err = float((out[: case.tokens].float() - case.ref).abs().max())
            rows.append((mode, "captured", f"replay err vs the float32 reference {err:.4f}"))
        except Exception as exc:  # noqa: BLE001
            rows.append((mode, "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"))
            torch.cuda.synchronize()
        case = Case([250, 250], SHAPE, device)  # fresh buffers after a failed capture
        run = cudnn_call(case)
    varlen = make_backend("varlen", device, torch.bfloat16, shape=SHAPE)
    timings = []
    for n in () if args.no_eager else (128, 512, 4096):
        c = Case([n], SHAPE, device)
        fn = cudnn_call(c)
        err = float((fn().float() - c.ref).abs().max())
        v = eager_us(lambda c=c: varlen.forward(c.q, c.k, c.v, c.meta, True, SHAPE.scale))
        timings.append((n, eager_us(fn), v, err))
    print("\ncapture mode   result    detail")
    for mode, result, detail in rows:
        print(f"{mode:14s} {result:9s} {detail}")
    print("\ntokens  cudnn eager us (K/V repeated outside)  varlen eager us  cudnn err")
    for n, c_us, v_us, err in timings:
        print(f"{n:6d}  {c_us:38.1f}  {v_us:15.1f}  {err:.4f}")


if __name__ == "__main__":
    main()
