"""The persistent decoder's Triton kernels (rose.layers.persistent_decoder says what they do and why)."""

import triton
import triton.language as tl

from rose.layers.grid_sync import globaltimer, grid_barrier, sm_cycles
from rose.layers.persistent_attention import _attention, _attention_ready, _heads, _rope_rows


@triton.jit
def _ask_l2(at):
    """prefetch.global.L2 of the 128-byte lines at `at` (nothing held or waited for)."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [at], dtype=tl.int32, is_pure=False,
                              pack=1)


@triton.jit
def _prefetch(w_ptr, pid, nprog, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, SPLIT: tl.constexpr,
              GATED: tl.constexpr):
    """Pull into L2 the weight tiles this program's items of a later GEMM phase (_gemm's items, the same
    partition) will read: prefetch.global.L2 per 128-byte line, no registers held, nothing waited for. Weights
    do not depend on the activations, so a phase can ask for the next one's while its own work and the barrier
    run (NOTES: a GEMM phase's first bytes wait on HBM's latency, and programs reach it at once)."""
    KS: tl.constexpr = K // SPLIT
    LINES: tl.constexpr = KS // 64  # 64 bf16 or fp16 a line
    rows = tl.arange(0, BN)
    for item in range(pid, (N // BN) * SPLIT, nprog):
        row = w_ptr + ((item // SPLIT) * BN + rows) * K + (item % SPLIT) * KS
        for first in tl.static_range(0, LINES, 4):  # 4 lines of each row at a time (the last line again past the end)
            at = row[:, None] + tl.minimum(first + tl.arange(0, 4), LINES - 1)[None, :] * 64
            _ask_l2(at)
            if GATED:
                _ask_l2(at + N * K)

IDLE_LINES = tl.constexpr(4096)  # the most 128-byte lines an idle program asks into L2 a phase (512 KB, 16 a thread)


@triton.jit
def _prefetch_lines(w_ptr, busy, pid, nprog, ROWS: tl.constexpr, K: tl.constexpr, SPLIT: tl.constexpr,
                    STEP: tl.constexpr):
    """Tiles.prefetch "idle" and "first": the programs past the first `busy` (those with no work in this phase) ask
    into L2, with prefetch.global.L2 (nothing held or waited for), the first STEP columns of each of the weight's
    ROWS rows in each of its SPLIT slices of K, a contiguous run of 128-byte lines each: "idle" the whole weight
    (SPLIT 1, STEP K), "first" each item's first K step (the bytes an item waits for before its pipeline streams).
    Only where they cover all of them within IDLE_LINES each: a GEMM phase lasts as long as its slowest program,
    so a weight half in L2 would buy nothing. No program with work in the phase spends an instruction on it."""
    LPR: tl.constexpr = STEP // 64  # lines a row a slice (bf16 or fp16)
    LINES: tl.constexpr = ROWS * SPLIT * LPR
    KS: tl.constexpr = K // SPLIT
    idle = nprog - busy
    if (pid >= busy) & (idle * IDLE_LINES >= LINES):
        per = tl.cdiv(LINES, idle)
        first = (pid - busy) * per
        end = tl.minimum(first + per, LINES)
        for start in range(first, end, 256):
            j = tl.minimum(start + tl.arange(0, 256), end - 1)
            row, rest = j // (SPLIT * LPR), j % (SPLIT * LPR)
            _ask_l2(w_ptr + tl.cast(row, tl.int64) * K + (rest // LPR) * KS + (rest % LPR) * 64)


@triton.jit
def _norm_rows(res_ptr, add_ptr, add_b_ptr, w_ptr, b_ptr, dst_ptr, T, pid, nprog, eps, add, poison,
               H: tl.constexpr, BLOCK_H: tl.constexpr, SPLIT: tl.constexpr, LAYER_NORM: tl.constexpr,
               POST: tl.constexpr, BIAS: tl.constexpr):
    """x = res + the sum of add's SPLIT float32 partials ([SPLIT, T, H]) and its bias (BIAS), rounded once, when
    `add`; dst = RMSNorm(x) * w, or LayerNorm(x) * w + b (LAYER_NORM); NaN where `poison` (a barrier stalled).
    Pre-norm (Qwen3) keeps x as the residual; post-norm (POST, BERT: dst is res) the normed rows. One row per
    program at a time."""
    offs = tl.arange(0, BLOCK_H)
    ok = offs < H
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    dt = dst_ptr.dtype.element_ty
    for r in range(pid, T, nprog):
        x = tl.load(res_ptr + r * H + offs, mask=ok, other=0.0, cache_modifier=".cg")
        if add:
            y = tl.zeros([BLOCK_H], dtype=tl.float32)
            for s in tl.static_range(SPLIT):
                y += tl.load(add_ptr + (s * T + r) * H + offs, mask=ok, other=0.0, cache_modifier=".cg")
            if BIAS:
                y += tl.load(add_b_ptr + offs, mask=ok, other=0.0).to(tl.float32)
            x = (x.to(tl.float32) + y.to(dt).to(tl.float32)).to(dt)
            if not POST:
                tl.store(res_ptr + r * H + offs, x, mask=ok)
        y = _normed(x.to(tl.float32), ok, w, b_ptr, offs, eps, dt, H, LAYER_NORM)
        tl.store(dst_ptr + r * H + offs, tl.where(poison, float("nan"), y).to(dt), mask=ok)


@triton.jit
def _normed(v, ok, w, b_ptr, offs, eps, dt, H: tl.constexpr, LAYER_NORM: tl.constexpr):
    """A row's norm in float32 (before its last rounding): torch's LayerNorm (float32 inside, rounded once), or
    Qwen3's RMSNorm (w * round(x * rstd))."""
    if LAYER_NORM:
        centred = tl.where(ok, v - tl.sum(v, axis=0) / H, 0.0)
        rstd = tl.rsqrt(tl.sum(centred * centred, axis=0) / H + eps)
        return centred * rstd * w + tl.load(b_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(v * v, axis=0) / H + eps)
    return (v * rstd).to(dt).to(tl.float32) * w


@triton.jit
def _embed_rows(ids_ptr, types_ptr, pos_ptr, wemb_ptr, temb_ptr, pemb_ptr, w_ptr, b_ptr, dst_ptr, T, pid, nprog,
                eps, H: tl.constexpr, BLOCK_H: tl.constexpr, TYPES: tl.constexpr):
    """BERT's embeddings, a row per program at a time: LayerNorm(word + token type (type 0 unless TYPES) +
    position), rounded as torch's modules round them (each sum, then the norm once)."""
    offs = tl.arange(0, BLOCK_H)
    ok = offs < H
    w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
    dt = dst_ptr.dtype.element_ty
    for r in range(pid, T, nprog):
        kind = tl.load(types_ptr + r) if TYPES else 0
        x = (tl.load(wemb_ptr + tl.load(ids_ptr + r) * H + offs, mask=ok, other=0.0).to(tl.float32)
             + tl.load(temb_ptr + kind * H + offs, mask=ok, other=0.0).to(tl.float32)).to(dt).to(tl.float32)
        x = (x + tl.load(pemb_ptr + tl.load(pos_ptr + r) * H + offs, mask=ok, other=0.0).to(tl.float32)).to(dt)
        tl.store(dst_ptr + r * H + offs, _normed(x.to(tl.float32), ok, w, b_ptr, offs, eps, dt, H, True).to(dt),
                 mask=ok)

@triton.jit
def _gemm(a_ptr, w_ptr, b_ptr, dst_ptr, T, pid, nprog, N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr,
          BN: tl.constexpr, BK: tl.constexpr, SPLIT: tl.constexpr, ACT: tl.constexpr):
    """a[T, K] @ w[N, K]^T, the work cut into (column tile, slice of K) items spread over the programs.
    ACT 0: dst [SPLIT, T, N] float32, item (tile, s) storing the s-th slice's partial product (the phase that
    reads dst sums the slices and adds a bias). ACT 1 (SPLIT 1): w is [2N, K] (gate rows, then up rows) and
    dst [T, N] = SiLU(a @ gate^T) * (a @ up^T) in dst's dtype, each product rounded first as the unfused path
    does. ACT 2 (SPLIT 1): dst = GELU(a @ w^T + b) (erf), the product rounded first."""
    KS: tl.constexpr = K // SPLIT
    rm = tl.arange(0, BLOCK_M)
    rk = tl.arange(0, BK)
    row_ok = rm < T
    for item in range(pid, (N // BN) * SPLIT, nprog):
        tile = item // SPLIT
        k_lo = (item % SPLIT) * KS
        rn = tile * BN + tl.arange(0, BN)
        acc = tl.zeros([BLOCK_M, BN], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_M, BN], dtype=tl.float32)
        for k0 in range(k_lo, k_lo + KS, BK):
            a = tl.load(a_ptr + rm[:, None] * K + k0 + rk[None, :], mask=row_ok[:, None], other=0.0,
                        cache_modifier=".cg")
            w = tl.load(w_ptr + rn[:, None] * K + k0 + rk[None, :])
            acc = tl.dot(a, tl.trans(w), acc)
            if ACT == 1:
                u = tl.load(w_ptr + (rn[:, None] + N) * K + k0 + rk[None, :])
                acc_up = tl.dot(a, tl.trans(u), acc_up)
        dt = dst_ptr.dtype.element_ty
        if ACT == 1:
            g = acc.to(dt).to(tl.float32)
            y = (g / (1.0 + tl.exp(-g))).to(dt).to(tl.float32) * acc_up.to(dt).to(tl.float32)
            tl.store(dst_ptr + rm[:, None] * N + rn[None, :], y.to(dt), mask=row_ok[:, None])
        elif ACT == 2:
            g = (acc + tl.load(b_ptr + rn).to(tl.float32)[None, :]).to(dt).to(tl.float32)
            y = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
            tl.store(dst_ptr + rm[:, None] * N + rn[None, :], y.to(dt), mask=row_ok[:, None])
        else:
            part = dst_ptr + (item % SPLIT) * T * N
            tl.store(part + rm[:, None] * N + rn[None, :], acc, mask=row_ok[:, None])

# One compile per token block, not per count; nor per alignment of positions and sequence ids, views into a packed
# buffer that are 16-byte aligned only for an even count (warm-up's own tensors always are)
@triton.jit(do_not_specialize=["T", "final", "first", "last"], do_not_specialize_on_alignment=["pos_ptr", "seq_ptr"])
def decoder_kernel(res_ptr, h_ptr, qkv_ptr, heads_ptr, attn_ptr, od_ptr, act_ptr, out_ptr,
                   wqkv_ptr, wo_ptr, wgu_ptr, wd_ptr, bqkv_ptr, bo_ptr, bgu_ptr, bd_ptr,
                   ln1_ptr, ln1b_ptr, ln2_ptr, ln2b_ptr, fin_ptr, finb_ptr, qn_ptr, kn_ptr,
                   pos_ptr, seq_ptr, inv_freq_ptr, rope_ptr, flags_ptr, clock_ptr,
                   ids_ptr, types_ptr, wemb_ptr, temb_ptr, pemb_ptr, eln_ptr, elnb_ptr, T, eps, scale, final, first,
                   last,
                   H: tl.constexpr, BLOCK_H: tl.constexpr, NH: tl.constexpr, NKV: tl.constexpr,
                   HALF: tl.constexpr, INNER: tl.constexpr, BLOCK_M: tl.constexpr, BN_QKV: tl.constexpr,
                   BN_O: tl.constexpr, BN_GU: tl.constexpr, BN_D: tl.constexpr, S_QKV: tl.constexpr,
                   S_OD: tl.constexpr, BK: tl.constexpr, BQ: tl.constexpr, BKEY: tl.constexpr,
                   CAUSAL: tl.constexpr, POST: tl.constexpr, LAYER_NORM: tl.constexpr, BIAS: tl.constexpr,
                   ACT: tl.constexpr, ROPE: tl.constexpr, NPROG_P2: tl.constexpr, CLOCK: tl.constexpr,
                   PERSISTENT: tl.constexpr, FENCE: tl.constexpr, PHASES: tl.constexpr, SPINS: tl.constexpr,
                   PREFETCH: tl.constexpr, EMBED: tl.constexpr, TYPES: tl.constexpr, HEADS: tl.constexpr,
                   BR: tl.constexpr, STALL_EVERY: tl.constexpr):
    """Steps [first, last) of the decoder: step = layer * PHASES + phase (module docstring); the step after the
    last layer's is the final norm. HEADS (PHASES 8): the heads step (_heads) is the third step of a layer and
    attention over its ready heads the fourth, the later ones a step on; `phase` below holds the step's kind
    (rose.layers.persistent_decoder.layer_kinds: 7 the heads step). Without it (PHASES 7) attention computes its heads
    itself. qkv_ptr and od_ptr hold float32 partials of K's slices (S_QKV; S_OD for
    the o and down projections), summed where they are read (with their biases, BIAS). The family: Qwen3 is
    pre-norm, RMSNorm, SiLU-gated (ACT 1), QK-norm + RoPE (ROPE); BERT is post-norm (POST: h_ptr is res_ptr,
    phase 0 of layer l > 0 is layer l - 1's output norm, ln1 holds those), LayerNorm, biases, GELU (ACT 2).
    PERSISTENT: a grid barrier after each step but the last (and after the last too when CLOCK). CLOCK 1: program 0
    reads the clock before the first step and after each barrier (clock_ptr [steps + 1]); CLOCK 2: every program
    writes [start ns, end ns, start cycle, end cycle] of its work in each step (clock_ptr [steps, programs, 4]; the
    end read after a bar.sync, so once all its warps are done). EMBED (post-norm only): step 0 computes BERT's
    embeddings from the ids (and token types, TYPES) into the residual. PREFETCH 1 (Tiles.prefetch "own"): each GEMM
    phase's weights are asked into L2 a phase early, where no weights stream (the norms for the QKV and gate-up,
    attention for o) or after the gate-up's own work (for down); 2 ("idle"): the same phases but down's, by the
    programs with no work in them (_prefetch_lines); 3 ("first"): only each item's first K step, down's too, by
    the programs with no item in the gate-up."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    D: tl.constexpr = 2 * HALF
    QKV_N: tl.constexpr = (NH + 2 * NKV) * D
    GU_N: tl.constexpr = 2 * INNER if ACT == 1 else INNER  # the gate-up weight's rows
    if CLOCK == 1 and pid == 0:
        tl.store(clock_ptr + first, globaltimer())
    passed = 0  # barriers passed in this launch (BERT's step 0 without the embeddings has none)
    for step in range(first, last):
        if CLOCK == 2:
            slot = clock_ptr + (tl.cast(step, tl.int64) * nprog + pid) * 4
            tl.store(slot, globaltimer())
            tl.store(slot + 2, sm_cycles())
        layer = tl.cast(step // PHASES, tl.int64)
        phase = step % PHASES
        if HEADS and phase >= 2:  # the same kinds of work with and without the heads step: 7 is the heads step
            phase = tl.where(phase == 2, 7, phase - 1)
        if phase == 0:
            if step == final:
                stalled = tl.load(flags_ptr + nprog, volatile=True) != 0
                _norm_rows(res_ptr, od_ptr, bd_ptr + (layer - 1) * H, fin_ptr, finb_ptr, out_ptr, T, pid, nprog,
                           eps, True, stalled, H, BLOCK_H, S_OD, LAYER_NORM, POST, BIAS)
            else:
                if PREFETCH == 1:
                    _prefetch(wqkv_ptr + layer * (QKV_N * H), pid, nprog, QKV_N, H, BN_QKV, S_QKV, False)
                elif PREFETCH >= 2:  # the rows' programs busy; 2 the whole weight, 3 each item's first K step
                    _prefetch_lines(wqkv_ptr + layer * (QKV_N * H), tl.minimum(T, nprog), pid, nprog, QKV_N, H,
                                    1 if PREFETCH == 2 else S_QKV, H if PREFETCH == 2 else BK)
                if POST:  # layer l - 1's output norm; at layer 0 the embeddings (EMBED), else they come normed
                    if layer > 0:
                        _norm_rows(res_ptr, od_ptr, bd_ptr + (layer - 1) * H, ln1_ptr + (layer - 1) * H,
                                   ln1b_ptr + (layer - 1) * H, h_ptr, T, pid, nprog, eps, True, False, H, BLOCK_H,
                                   S_OD, LAYER_NORM, POST, BIAS)
                    elif EMBED:
                        _embed_rows(ids_ptr, types_ptr, pos_ptr, wemb_ptr, temb_ptr, pemb_ptr, eln_ptr, elnb_ptr,
                                    res_ptr, T, pid, nprog, eps, H, BLOCK_H, TYPES)
                else:
                    _norm_rows(res_ptr, od_ptr, bd_ptr + (layer - 1) * H, ln1_ptr + layer * H, ln1b_ptr + layer * H,
                               h_ptr, T, pid, nprog, eps, step > 0, False, H, BLOCK_H, S_OD, LAYER_NORM, POST, BIAS)
                if ROPE and step == 0:
                    _rope_rows(pos_ptr, inv_freq_ptr, rope_ptr, T, pid, nprog, attn_ptr.dtype.element_ty, HALF)
        elif phase == 1:
            _gemm(h_ptr, wqkv_ptr + layer * (QKV_N * H), bqkv_ptr, qkv_ptr, T, pid, nprog, QKV_N, H, BLOCK_M,
                  BN_QKV, BK, S_QKV, 0)
        elif phase == 2:
            if PREFETCH == 1:
                _prefetch(wo_ptr + layer * (H * NH * D), pid, nprog, H, NH * D, BN_O, S_OD, False)
            elif PREFETCH >= 2:  # attention's items busy (a q head and a block of queries each)
                _prefetch_lines(wo_ptr + layer * (H * NH * D), tl.minimum(NH * tl.cdiv(T, BQ), nprog), pid, nprog, H,
                                NH * D, 1 if PREFETCH == 2 else S_OD, NH * D if PREFETCH == 2 else BK)
            if HEADS:
                _attention_ready(heads_ptr, attn_ptr, seq_ptr, T, pid, nprog, scale, NH, NKV, D, BQ, BKEY, CAUSAL)
            else:
                _attention(qkv_ptr, bqkv_ptr + layer * QKV_N, attn_ptr, qn_ptr + layer * D, kn_ptr + layer * D,
                           rope_ptr, seq_ptr, T, pid, nprog, eps, scale, NH, NKV, HALF, BLOCK_M, BQ, BKEY, CAUSAL,
                           S_QKV, BIAS, ROPE)
        elif phase == 3:
            _gemm(attn_ptr, wo_ptr + layer * (H * NH * D), bo_ptr, od_ptr, T, pid, nprog, H, NH * D, BLOCK_M,
                  BN_O, BK, S_OD, 0)
        elif phase == 4:
            if PREFETCH == 1:
                _prefetch(wgu_ptr + layer * (GU_N * H), pid, nprog, INNER, H, BN_GU, 1, ACT == 1)
            elif PREFETCH >= 2:
                _prefetch_lines(wgu_ptr + layer * (GU_N * H), tl.minimum(T, nprog), pid, nprog, GU_N, H, 1,
                                H if PREFETCH == 2 else BK)
            _norm_rows(res_ptr, od_ptr, bo_ptr + layer * H, ln2_ptr + layer * H, ln2b_ptr + layer * H, h_ptr, T,
                       pid, nprog, eps, True, False, H, BLOCK_H, S_OD, LAYER_NORM, POST, BIAS)
        elif phase == 5:
            if PREFETCH == 3:  # the gate-up's items busy (one a program): the rest ask for down's first K steps
                _prefetch_lines(wd_ptr + layer * (H * INNER), tl.minimum(INNER // BN_GU, nprog), pid, nprog, H, INNER,
                                S_OD, BK)
            _gemm(h_ptr, wgu_ptr + layer * (GU_N * H), bgu_ptr + layer * INNER, act_ptr, T, pid, nprog, INNER, H,
                  BLOCK_M, BN_GU, BK, 1, ACT)
            if PREFETCH == 1:
                _prefetch(wd_ptr + layer * (H * INNER), pid, nprog, H, INNER, BN_D, S_OD, False)
        elif phase == 6:
            _gemm(act_ptr, wd_ptr + layer * (H * INNER), bd_ptr, od_ptr, T, pid, nprog, H, INNER, BLOCK_M, BN_D,
                  BK, S_OD, 0)
        else:
            _heads(qkv_ptr, bqkv_ptr + layer * QKV_N, heads_ptr, qn_ptr + layer * D, kn_ptr + layer * D, rope_ptr,
                   T, pid, nprog, eps, NH, NKV, HALF, BR, S_QKV, BIAS, ROPE)
        if CLOCK == 2:
            tl.debug_barrier()
            tl.store(slot + 1, globaltimer())
            tl.store(slot + 3, sm_cycles())
        if PERSISTENT and (CLOCK or (step < final and not (POST and step == 0 and not EMBED))):  # (no work)
            passed += 1
            grid_barrier(flags_ptr, pid, nprog, passed, NPROG_P2, FENCE, SPINS, STALL_EVERY)
        if CLOCK == 1 and pid == 0:
            tl.store(clock_ptr + step + 1, globaltimer())
