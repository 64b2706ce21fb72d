"""The persistent decoder compiled for sm_90 (the H100 and H200) on a machine without a GPU: per token block, the
kernel's shared memory, registers and spill stack, and what its GEMM loops became (its cp.async, wgmma and
mma.sync instructions), from Triton's own compiler and the cuobjdump of its wheel. Tells before a device call whether
a tile change fits an SM's 227 KB of shared memory and whether its K loops are software-pipelined (stages).

    python -m benchmarks.persistent_sass [--model qwen3-0.6b] [--tokens 16,32,64,128] [--tiles stages=4]
                                         [--clock 0|1|2]

The weights and buffers are on the meta device: only their dtypes and shapes reach the compiler. Pointers are
compiled 16-byte aligned, as the launches specialize them (positions and sequence ids excepted). This Triton
may not be the device's: its numbers are what this version makes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import tempfile

import torch

SMEM_LIMIT = 227 * 1024  # an sm_90 block's most shared memory
POINTER_TYPES = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32", torch.int32: "*i32",
                 torch.int64: "*i64"}
SASS_OPS = {"cp.async": "LDGSTS", "wgmma": "HGMMA", "mma.sync": "HMMA"}


def meta_decoder(model: str, tiles: dict | None = None, programs: int = 132):
    """A PersistentDecoder of the zoo config `model` (two layers: the kernel does not depend on their count) on
    the meta device, its fitted tiles changed by `tiles` (every block) when given."""
    from benchmarks.model_zoo import QWEN3_CONFIGS
    from rose.layers.persistent_decoder import PersistentDecoder
    from rose.models.qwen3 import Qwen3Model

    with torch.device("meta"):
        qwen = Qwen3Model(dict(QWEN3_CONFIGS[model], num_hidden_layers=2), causal=True).to(torch.bfloat16)
    decoder = PersistentDecoder(qwen, programs=programs)
    if tiles:
        decoder.tiles = dataclasses.replace(decoder.tiles, **tiles)
    return decoder


def compile_block(decoder, tokens: int, clock: int = 0) -> dict:
    """decoder_kernel for a batch of `tokens`, compiled for sm_90: its resources and SASS counts."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    from rose.layers.persistent_kernels import decoder_kernel

    rows = torch.empty(tokens, decoder.hidden, dtype=decoder.w.wqkv.dtype, device="meta")
    index = torch.empty(tokens, dtype=torch.int64, device="meta")  # positions and sequence ids, as rose.meta packs
    work = decoder.workspace(rows, index, index)
    clocks = {0: None, 1: torch.empty(decoder.steps(tokens) + 1, dtype=torch.int64, device="meta"),
              2: torch.empty(decoder.steps(tokens), decoder.programs, 4, dtype=torch.int64, device="meta")}
    args, meta = decoder.kernel_args(work, clock=clocks[clock])
    names = decoder_kernel.arg_names
    unaligned = {p.name for p in decoder_kernel.params if getattr(p, "do_not_specialize_on_alignment", False)}
    values = dict(zip(names, (*args, 0, decoder.steps(tokens))))  # first, last
    values.update(PERSISTENT=True, **meta)
    warps, stages = values.pop("num_warps"), values.pop("num_stages")
    signature, constants, attrs = {}, {}, {}
    for i, name in enumerate(names):
        value = values[name]
        if isinstance(value, torch.Tensor):
            signature[name] = POINTER_TYPES[value.dtype]
            if name not in unaligned:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in meta or name == "PERSISTENT":
            signature[name], constants[(i,)] = "constexpr", value
        else:
            signature[name] = "fp32" if isinstance(value, float) else "i32"
    target = GPUTarget("cuda", 90, 32)
    options = make_backend(target).parse_options({"num_warps": warps, "num_stages": stages})
    kernel = triton.compile(triton.compiler.ASTSource(decoder_kernel, signature, constants, attrs), target=target,
                            options=options.__dict__)
    sass, resources = _disassembled(kernel.asm["cubin"])
    ops = re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)", sass, re.MULTILINE)
    return {"tokens": tokens, "block_m": meta["BLOCK_M"], "stages": stages, "warps": warps,
            "smem": kernel.metadata.shared, "fits": kernel.metadata.shared <= SMEM_LIMIT, **resources,
            **{name: ops.count(op) for name, op in SASS_OPS.items()}}


def cuobjdump() -> str:
    """The cuobjdump in Triton's wheel (it may be absent: a wheel without the NVIDIA backend's tools)."""
    import triton

    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def _disassembled(cubin: bytes) -> tuple[str, dict]:
    tool = cuobjdump()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([tool, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"(REG|STACK):(\d+)", usage))
    return sass, {"registers": int(found.get("REG", 0)), "stack": int(found.get("STACK", 0))}


def main() -> None:
    from benchmarks.model_zoo import QWEN3_CONFIGS
    from benchmarks.persistent_decoder import tile_changes

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="qwen3-0.6b", choices=sorted(QWEN3_CONFIGS))
    parser.add_argument("--tokens", default="16,32,64,128")
    parser.add_argument("--tiles", default="", help="changes to the fitted tiles at every block, e.g. stages=4 "
                        "(as benchmarks.persistent_decoder --tiles); the blocks' own tiles when omitted")
    parser.add_argument("--clock", type=int, default=0, choices=(0, 1, 2))
    args = parser.parse_args()
    decoder = meta_decoder(args.model, tile_changes(args.tiles) if args.tiles else None)
    columns = ("tokens", "block_m", "stages", "warps", "smem", "fits", "registers", "stack", *SASS_OPS)
    print(f"{args.model} · sm_90 · Triton's compiler on this machine · clock {args.clock}")
    print(" ".join(f"{c:>9}" for c in columns))
    for tokens in args.tokens.split(","):
        row = compile_block(decoder, int(tokens), args.clock)
        print(" ".join(f"{row[c]!s:>9}" for c in columns))


if __name__ == "__main__":
    main()
