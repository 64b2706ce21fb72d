"""Each phase of the persistent decoder against the layer path's own kernels (rose.layers.fused), one step at a
time (PersistentDecoder.run over a Workspace): the residual adds the same bits as the layer kernel's; the norms,
the RoPE table and SiLU·mul off on at most 0.1 % of the elements (a float32 sum's order; a rounding step missed
moves a third of them), and then by a step or two: the norms' rstd can differ by a float32 ulp (the kernels sum
the squares in different orders), which a weight under 1 can turn into two steps; SiLU·mul's gate and up come
from float32 sums the reference takes in float64, so where either nearly cancels (|x| under 1e-3 of its
largest) any number of steps, elsewhere within a step of the unfused result for gate and up rounded either way
from exact (assert_gated: silu's slope makes that four steps at g = -5), and the share off may be that of the layer
path's own GEMM (its float32 sums rounded as the kernel's are) against the same reference, up to 1.5 x, where that
passes 0.1 % (the H200 at f7c5ade: 0.11 %); q and k after the heads step off on 0.1 %, each within two steps at
its head row's scale; the projections' float32 partials summing to the float64 product
within float32's accumulation error; attention within bf16's error of a float32 one from the layer kernels' q,
k and v. Qwen3's phases against rose.layers.fused, BERT's against torch's Linear, LayerNorm and GELU. Used by the
GPU test (test_rose_persistent_phases_gpu.py, bf16) and under Triton's interpreter on the CPU
(persistent_interpreted.py, float32: the checks themselves checked)."""

from __future__ import annotations

import torch

from rose.layers import fused
from rose.layers.persistent_decoder import HEADS_KIND


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """bf16 bits as integers in the values' order (adjacent bf16 values differ by 1; -0 = +0)."""
    bits = x.contiguous().view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits + 32768), bits)


def assert_within_a_step(got: torch.Tensor, want: torch.Tensor, what: str, share: float = 1e-3, steps: int = 1,
                         where: torch.Tensor | None = None) -> None:
    """got and want (bf16) differ on at most `share` of the elements, and by at most `steps` bf16 steps (where
    `where` is true, when given)."""
    apart = (_ordered(got.to(torch.bfloat16)) - _ordered(want.to(torch.bfloat16))).abs()
    off = (apart > 0).float().mean().item()
    worst = int((apart if where is None else apart[where]).max())
    assert worst <= steps and off <= share, f"{what}: {off:.2%} of elements off, up to {worst} steps"


def _from_ordered(o: torch.Tensor) -> torch.Tensor:
    """_ordered's inverse: integers in the values' order back to bf16."""
    return torch.where(o < 0, -o - 32768, o).to(torch.int16).view(torch.bfloat16)


def _bracket(exact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two bf16 values around each float64 value (equal where it is one), in _ordered's integers."""
    near = exact.to(torch.bfloat16)
    o = _ordered(near)
    return o, o + torch.sign(exact - near.double()).to(o.dtype)


def assert_gated(got: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, where: torch.Tensor, what: str) -> None:
    """SiLU(gate) * up from float32 sums that may round to either bf16 value around the exact (float64) product:
    where `where` is true, got lies within a bf16 step of the unfused path's result for one of those four pairs
    of gate and up (a step: silu's float32 exp differs in its last bits). A fixed count of steps is no bound:
    silu's relative slope 1 + g (1 - sigmoid(g)) is ~-4 at g = -5, so a gate a step apart moves silu(gate) by
    four (the H200 at 11c8496: one element 3 steps from the exact product's rounding)."""
    gates, ups = _bracket(gate), _bracket(up)
    near = _ordered(torch.stack([fused.silu_mul(torch.cat([_from_ordered(g), _from_ordered(u)], dim=-1))
                                 for g in gates for u in ups]))
    o = _ordered(got.to(torch.bfloat16))
    outside = ((o < near.amin(0) - 1) | (o > near.amax(0) + 1)) & where
    assert not outside.any(), f"{what}: {int(outside.sum())} elements outside their gate and up's roundings"


def _share_off(got: torch.Tensor, want: torch.Tensor) -> float:
    return (_ordered(got.to(torch.bfloat16)) != _ordered(want.to(torch.bfloat16))).float().mean().item()


def assert_rotated(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """QK-normed and rotated heads [T, heads, D]: off on at most 0.1 % of the elements, and each within two bf16
    steps at its head row's scale (RoPE's n1 c - n2 s cancels: a step of its inputs can be many of a small output)."""
    apart = _share_off(got, want)
    scale = want.float().abs().amax(-1, keepdim=True).clamp_min(1e-30)
    worst = ((got.float() - want.float()).abs() / scale).max().item()
    assert apart <= 1e-3 and worst <= 2 ** -7, f"{what}: {apart:.2%} of elements off, up to {worst:.2e} of the row"


def assert_product(partials: torch.Tensor, a: torch.Tensor, w: torch.Tensor, what: str) -> None:
    """The float32 partials [slices, T, N] sum to a @ w^T (computed in float64) within float32's error."""
    want = a.double() @ w.double().T
    got = partials.double().sum(0)
    err = ((got - want).abs().max() / want.abs().max()).item()
    assert err < 1e-5, f"{what}: max error {err:.2e} of the largest element"


def _reference_attention(q, k, v, seq_ids, causal: bool) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v per q head over its kv head, masked to the query's sequence (and causally),
    float32 from the layer kernels' bf16 q, k, v."""
    t, heads, d = q.shape
    k = k.repeat_interleave(heads // k.shape[1], dim=1).float()
    v = v.repeat_interleave(heads // v.shape[1], dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", q.float(), k) / d ** 0.5
    mask = seq_ids[:, None] == seq_ids[None, :]
    if causal:
        mask &= torch.ones(t, t, dtype=torch.bool, device=q.device).tril()
    probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", probs, v).reshape(t, heads * d)


def _summed(partials: torch.Tensor) -> torch.Tensor:
    """The slices' float32 partials summed in the kernel's order (0 + p0 + p1 + ...)."""
    total = partials[0].clone()
    for part in partials[1:]:
        total += part
    return total


def check_phases(dec, embedded: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor, causal: bool) -> int:
    """Run every step of `dec` over `embedded` one launch at a time, checking each against the layer path;
    returns how many steps were checked (AssertionError naming the layer and phase on the first miss)."""
    check = _check_bert_step if dec.w.post else _check_qwen3_step
    with torch.inference_mode():
        work = dec.workspace(embedded, positions, seq_ids)
        steps = dec.steps(embedded.shape[0])
        for step in range(steps):
            before = {"residual": work.residual.clone(), "od": work.od.clone()}
            dec.run(work, step, step + 1, persistent=False)
            check(dec, work, before, step, positions, seq_ids, causal)
    return steps


def _check_qwen3_step(dec, work, before, step: int, positions, seq_ids, causal: bool) -> None:
    d, q_size, kv_size = dec.head_dim, dec.heads * dec.head_dim, dec.kv_heads * dec.head_dim
    residual, od = before["residual"], before["od"]
    tokens = work.residual.shape[0]
    layer, phase = dec.step_kind(step, tokens)
    what = f"layer {layer} phase {phase}"
    if phase == 0:
        weight = dec.w.final if step == dec.steps(tokens) - 1 else dec.w.ln1[layer]
        if step == 0:  # the embeddings, no add; and the RoPE table
            assert torch.equal(work.residual, residual)
            want = fused.rms_norm(residual, weight, dec.eps)
            freqs = positions.float()[:, None] * dec.w.inv_freq[None, :]
            assert_within_a_step(work.rope[0], freqs.cos(), "RoPE cos")
            assert_within_a_step(work.rope[1], freqs.sin(), "RoPE sin")
        else:
            summed = _summed(od).to(residual.dtype)
            want, want_residual = fused.add_rms_norm(summed, residual, weight, dec.eps)
            assert torch.equal(work.residual, want_residual), f"{what}: the residual add"
        got = work.out if step == dec.steps(tokens) - 1 else work.h
        assert_within_a_step(got, want, what, steps=2)
    elif phase == 1:
        assert_product(work.qkv, work.h, dec.w.wqkv[layer], what)
    elif phase == 2:
        qkv = _summed(work.qkv).to(work.h.dtype)
        q, k = fused.qk_norm_rope(qkv, dec.w.qn[layer], dec.w.kn[layer], positions, dec.w.inv_freq,
                                  dec.heads, dec.kv_heads, d, dec.eps)
        v = qkv[:, q_size + kv_size:].reshape(-1, dec.kv_heads, d)
        _assert_attention(work.attn, q, k, v, seq_ids, causal, what)
    elif phase == HEADS_KIND:
        qkv = _summed(work.qkv).to(work.h.dtype)
        q, k = fused.qk_norm_rope(qkv, dec.w.qn[layer], dec.w.kn[layer], positions, dec.w.inv_freq,
                                  dec.heads, dec.kv_heads, d, dec.eps)
        assert torch.equal(work.heads[:, q_size + kv_size:], qkv[:, q_size + kv_size:]), f"{what}: v"
        assert_rotated(work.heads[:, :q_size].reshape(q.shape), q, f"{what}: q")
        assert_rotated(work.heads[:, q_size:q_size + kv_size].reshape(k.shape), k, f"{what}: k")
    elif phase == 3:
        assert_product(work.od, work.attn, dec.w.wo[layer], what)
    elif phase == 4:
        want, want_residual = fused.add_rms_norm(_summed(od).to(residual.dtype), residual, dec.w.ln2[layer],
                                                 dec.eps)
        assert torch.equal(work.residual, want_residual), f"{what}: the residual add"
        assert_within_a_step(work.h, want, what, steps=2)
    elif phase == 5:
        exact = work.h.double() @ dec.w.wgu[layer].double().T
        gate, up = exact.abs().chunk(2, dim=-1)
        clear = (gate > 1e-3 * gate.max()) & (up > 1e-3 * up.max())
        want = fused.silu_mul(exact.to(work.h.dtype))
        # float32 sums of the same bf16 inputs, rounded once (as the kernel's and cuBLAS's; not a bf16 reduction)
        served = fused.silu_mul((work.h.float() @ dec.w.wgu[layer].float().T).to(work.h.dtype))
        share = min(5e-3, max(1e-3, 1.5 * _share_off(served, want)))
        off = _share_off(work.act, want)
        assert off <= share, f"{what}: {off:.2%} of elements off (bar {share:.3%})"
        assert_gated(work.act, *exact.chunk(2, dim=-1), clear, what)
    else:
        assert_product(work.od, work.act, dec.w.wd[layer], what)


def _check_bert_step(dec, work, before, step: int, positions, seq_ids, causal: bool) -> None:
    """BERT (post-norm): as torch's nn.Linear (the bias added to the float32 product, rounded once), the bf16
    residual add, torch's LayerNorm and exact GELU compute them; the residual stream is the normed rows."""
    d, hidden = dec.head_dim, dec.hidden
    residual, od = before["residual"], before["od"]
    dt = residual.dtype
    tokens = work.residual.shape[0]
    layer, phase = dec.step_kind(step, tokens)
    what = f"layer {layer} phase {phase}"
    w = dec.w
    if phase in (0, 4):
        final = step == dec.steps(tokens) - 1
        if step == 0:  # the embeddings come normed: nothing to do
            assert torch.equal(work.residual, residual), f"{what}: the embeddings changed"
            return
        at = layer - 1 if phase == 0 else layer  # phase 0 ends layer - 1 (its output LayerNorm)
        bias, weight, norm_bias = ((w.bd[at], w.final if final else w.ln1[at], w.final_b if final else w.ln1b[at])
                                   if phase == 0 else (w.bo[at], w.ln2[at], w.ln2b[at]))
        projected = (_summed(od) + bias.float()).to(dt)
        summed = (projected.float() + residual.float()).to(dt)
        want = torch.nn.functional.layer_norm(summed.float(), (hidden,), weight.float(), norm_bias.float(),
                                              dec.eps).to(dt)
        assert_within_a_step(work.out if final else work.residual, want, what, steps=2)
    elif phase == 1:
        assert_product(work.qkv, work.h, w.wqkv[layer], what)
    elif phase == HEADS_KIND:
        assert torch.equal(work.heads, (_summed(work.qkv) + w.bqkv[layer].float()).to(dt)), f"{what}: q, k, v"
    elif phase == 2:
        qkv = (_summed(work.qkv) + w.bqkv[layer].float()).to(dt)
        q, k, v = (part.reshape(-1, dec.heads, d) for part in qkv.split(dec.heads * d, dim=-1))
        _assert_attention(work.attn, q, k, v, seq_ids, causal, what)
    elif phase == 3:
        assert_product(work.od, work.attn, w.wo[layer], what)
    elif phase == 5:
        exact = work.h.double() @ w.wgu[layer].double().T + w.bgu[layer].double()
        clear = exact.abs() > 1e-3 * exact.abs().max()  # GELU near 0 is x / 2: nearly cancelled sums differ
        want = torch.nn.functional.gelu(exact.to(dt).float()).to(dt)
        assert_within_a_step(work.act, want, what, steps=2, where=clear)
    else:
        assert_product(work.od, work.act, w.wd[layer], what)


def _assert_attention(got, q, k, v, seq_ids, causal: bool, what: str) -> None:
    want = _reference_attention(q, k, v, seq_ids, causal)
    err = ((got.float() - want).norm() / want.norm()).item()
    assert err < 1e-2, f"{what}: relative error {err:.2e}"
