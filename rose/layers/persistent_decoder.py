"""A Qwen3 decoder's or a BERT-style encoder's every layer in one persistent kernel, for small batches (at most
128 tokens). The families' weights and forms: rose.layers.persistent_models.

Why (issue 14, benchmarks/NOTES.md "One persistent kernel for the decoder at small batches"): at 128 tokens a
layer is nine kernels, and each GEMM costs >= 5.5 µs in a graph whatever its size (the o and down projections
cover 8 of 132 SMs with cuBLAS's tiles); split-K, folded norms, PDL and L2-resident weights were each
refuted. Here one program per SM walks every layer's phases, the work of a phase spread over all programs,
with a grid barrier between phases in place of a kernel boundary:

    0 add + RMSNorm (input_layernorm)  rows           4 add + RMSNorm (post_attention_layernorm)  rows
    1 QKV projection                   tiles x slices 5 gate-up projection, SiLU(gate) * up        tiles
    7 heads: QK-norm + RoPE, v summed  heads x rows   6 down projection                            tiles x slices
    2 attention over the ready heads   heads x blocks after the last layer: add + the final RMSNorm
    3 o projection                     tiles x slices

(by kind, in the kernel's order: the heads step, kind 7, runs after the QKV; without it, Tiles.heads off, attention
norms and rotates its heads itself, per q head and query block, and a layer is 7 steps: layer_kinds. A token
block's own tiles may drop it, so a forward's steps are its block's: kinds(tokens), steps(tokens)).

A BERT-style encoder takes the same steps in its own form: post-norm (phase 0 of layer l > 0 is layer l - 1's
add + output LayerNorm, the final step the last layer's; phase 4 its attention's), LayerNorm, the projections'
biases added where their partials are summed, GELU(up) for SiLU(gate) * up, no QK-norm or RoPE.

The QKV, o and down projections are split along K too (items of a column tile and a slice of K, each storing
its float32 partial), so that every SM has work and each item reads only its slice of the activations, which
it would otherwise re-read whole from L2; the phase that reads a projection sums its slices (the
heads step for the QKV, the next add+RMSNorm for o and down). Attention is, per q head and block of 32 queries,
an online softmax over the keys (all of a block's at once by default), masked to the query's own sequence (and
causally where the model is causal): any ragged batch of up to 128 tokens. Rounding follows the layer-by-layer
kernels (rose.layers.fused): bf16 residual sums, norm output and RoPE's cos/sin rounded, float32
inside.

The grid barrier (rose.layers.grid_sync.grid_barrier, its form Tiles.barrier): by default the counter form,
where after a bar.sync thread 0 of each program adds its arrival to one word with release order and polls that
word with acquire loads, then a bar.sync lets the program go (1.03 µs a barrier on an H100, against 1.28 for the
acquire form, where each program writes the barriers it passed into its own slot and spins on acquire reads of
every slot, and 1.71 for the fence form: NOTES, "The barrier's counter form"); so that its later loads see what
the others wrote, those loads also go past L1 (`.cg`). The words are zeroed before each launch (a memset node
in a graph). Every program must be
resident at once: the grid is at most the SM count, and only the runner's own forwards are routed here
(Qwen3Model.forward checks the backend), never the express lane's, whose second stream could run a second
persistent kernel at once, each waiting for programs the other holds. A wait is bounded (SPIN_LIMIT reads): a
program that gives up sets the stall word (the slot after the programs'), every later wait ends at once and
the final norm writes NaN rows, so a grid that cannot all be resident (fewer SMs than the device reports: MPS,
a green context) fails warm-up instead of hanging the device; a stall in serving fails that batch's requests
(Tulip refuses non-finite rows: tulip.completer.check_finite). `persistent=False` runs the same phases one
launch each, no barrier: the CPU tests (Triton's interpreter runs programs one after another, so a barrier
between several never opens: it stalls) and the A/B of barriers against launches.

Measured on the H200 at 11c8496 (NOTES, "Heads a step of their own"): the 0.6B's replay 21 / 14 / 7 % under the
layers at 16 / 64 / 128 tokens; through the engine, host to host, 9-15 % faster up to 128 tokens. all-MiniLM's:
21 % faster at 16 tokens, slower from 64. Hence each family up to where it won (`on`), and by default (`auto`) only
the layer shapes measured faster (rose.persistent_routing); the engine's warm-up turns it on (rose.layers.
persistent_attach: attach warm=False, then enable), after the kernels compiled ahead, so the kernel manifest records
its variants.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from rose.layers.persistent_models import shapes, stack, unsupported
from rose.layers.persistent_tiles import BLOCK_CHANGES, PREFETCHES, Tiles, block_tiles, fit_tiles
from rose.persistent_routing import MAX_TOKENS

try:
    import triton

    from rose.layers.persistent_kernels import decoder_kernel
except ImportError:  # pragma: no cover - depends on the torch build
    triton = None

# A layer's phases by kind; the kernel takes them in the order of layer_kinds (kind 7, the heads step, after the QKV
PHASE_NAMES = ("add+norm", "qkv", "attention", "o", "add+norm 2", "gate-up", "down", "heads")  # pre-norm (Qwen3)
POST_PHASE_NAMES = ("out add+LN", "qkv", "attention", "o", "attn add+LN", "up+GELU", "down", "heads")  # BERT's:
# phase 0 ends the layer before (its output LayerNorm; nothing at layer 0)
HEADS_KIND = 7


def layer_kinds(heads: bool) -> tuple[int, ...]:
    """A layer's phases in the kernel's order, by kind (PHASE_NAMES): with the heads step (Tiles.heads) its 8,
    else 7 (attention computes its heads itself)."""
    return (0, 1, HEADS_KIND, 2, 3, 4, 5, 6) if heads else (0, 1, 2, 3, 4, 5, 6)


SPIN_LIMIT = 1 << 21  # reads a barrier waits before it calls the grid stalled: ~1-2 s on the H200, ~1000 x a forward
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"  # Triton's interpreter: no inline assembly


class PersistentDecoder:
    """The layers of a Qwen3 decoder or a BERT-style encoder (rose.layers.persistent_models) as one kernel.

    Building it stacks each kind of weight over the layers and points the model's own parameters at views
    of the stacks, so the weights are held once. `__call__(residual, positions, seq_ids)` takes the token
    embeddings [T, hidden] (BERT's normed, as its embeddings module gives them) and returns the last hidden
    states, as the model's forward does."""

    def __init__(self, model, tiles: Tiles | None = None, programs: int | None = None, routed: int = MAX_TOKENS,
                 backend=None) -> None:
        """tiles: None fits them to the model's shapes (fit_tiles), with the changes measured faster at a token
        block for these shapes (BLOCK_CHANGES); given, they serve every block. routed: the largest batch (tokens) `fits`
        accepts; backend: the attention backend whose forwards the model's forward routes here (the runner's
        own: never the express lane's, whose second stream could run a second persistent kernel at once, each
        waiting for programs the other holds)."""
        reason = unsupported(model)
        if reason:
            raise ValueError(f"no persistent decoder for this model: {reason}")
        self.heads, self.kv_heads, self.head_dim, self.hidden, self.inner = shapes(model)
        self.qkv_size = (self.heads + 2 * self.kv_heads) * self.head_dim
        self.routed, self.backend = min(routed, MAX_TOKENS), backend
        # checked against the shapes (the setter) before the weights move
        self.shape = (self.hidden, self.qkv_size, self.heads * self.head_dim, self.inner)  # what tiles must divide
        if tiles is None:
            self.tiles = fit_tiles(*self.shape)
            self.change_blocks(BLOCK_CHANGES.get(self.shape, {}))
        else:
            self.tiles = tiles
        self.w = stack(model)
        self.eps, self.scale, self.causal, self.layers = self.w.eps, self.w.scale, self.w.causal, self.w.layers
        device = self.w.wqkv.device
        if programs is None:
            programs = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
        self.programs = programs
        # a slot a program, the stall word, and at the next power of two the counter form's word
        self.flags = torch.zeros(flags_words(programs), dtype=torch.int32, device=device)
        self.spins = SPIN_LIMIT

    @property
    def tiles(self) -> Tiles:
        return self._tiles

    @tiles.setter
    def tiles(self, tiles: Tiles) -> None:
        """Tiles for the next calls at every token block (a benchmark sweeps them), refused unless they divide every
        projection."""
        tiles.check(*self.shape)
        self._tiles = tiles
        self._blocks: dict[int, Tiles] = {}

    def change_blocks(self, changes: dict[int, dict]) -> None:
        """From the next call, the token blocks named run `tiles` with these changes ({block: {field: value}};
        persistent_tiles.block_tiles checks them); the others run `tiles`."""
        self._blocks = block_tiles(self._tiles, changes, *self.shape)

    def block_m(self, tokens: int) -> int:
        """The token block (the kernel's BLOCK_M) a batch of `tokens` runs in: a power of two, at least `rows`."""
        return max(self._tiles.rows, 1 << (tokens - 1).bit_length())

    def tiles_at(self, tokens: int) -> Tiles:
        """The tiles a batch of `tokens` runs with: its token block's own, else `tiles`."""
        return self._blocks.get(self.block_m(tokens), self._tiles)

    def fits(self, tokens: int) -> bool:
        return 0 < tokens <= self.routed

    def stalled(self) -> bool:
        """Whether the last launch's grid barrier gave up waiting (its rows are NaN): the programs were not all
        resident at once (an MPS or green-context share of the SMs, say). Synchronizes with the device."""
        return bool(self.flags[self.programs].item())

    def warm(self) -> int:
        """Compile and launch the kernel for every token block up to the routed bound now (a launch that the
        device cannot hold fails here, not in serving: so does a grid that stalls). Returns how many blocks
        ran."""
        device = self.w.wqkv.device
        blocks = [b for b in (16, 32, 64, 128) if b <= self.block_m(self.routed)]
        with torch.inference_mode():
            for block in blocks:
                zeros = torch.zeros(block, dtype=torch.int64, device=device)
                self(torch.zeros(block, self.hidden, dtype=self.w.wqkv.dtype, device=device), zeros, zeros)
                if self.stalled():
                    raise RuntimeError(f"the grid barrier stalled at {block} tokens: its {self.programs} programs "
                                       "were not all resident at once (fewer SMs than the device reports?)")
        return len(blocks)

    def __call__(self, residual: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor,
                 persistent: bool = True, clock: torch.Tensor | None = None) -> torch.Tensor:
        """Every layer and the final norm over `residual` (the embeddings [T, hidden]). clock (persistent only, a
        GPU only), int64 on the device: [steps + 1], program 0 writes the GPU's clock (ns) before the first step
        and after each step's barrier (benchmarks.persistent_decoder --phases); or [steps, programs, 4], every
        program writes its work's start and end in each step, in ns and in its SM's cycles
        (benchmarks.persistent_clock: the programs' skew, work and the barrier's release apart)."""
        work = self.workspace(residual, positions, seq_ids)
        self.run(work, 0, self.steps(residual.shape[0]), persistent, clock)
        return work.out

    def kinds(self, tokens: int) -> tuple[int, ...]:
        """A layer's phases in order for a batch of `tokens`, by kind (layer_kinds: its token block's Tiles.heads)."""
        return layer_kinds(self.tiles_at(tokens).heads)

    def steps(self, tokens: int) -> int:
        """Steps of a forward over `tokens`: a layer's phases (kinds) per layer, then the final norm."""
        return self.layers * len(self.kinds(tokens)) + 1

    def step_kind(self, step: int, tokens: int) -> tuple[int, int]:
        """(layer, kind) of a step of a forward over `tokens`; the final norm is (layers, 0)."""
        kinds = self.kinds(tokens)
        layer, phase = divmod(step, len(kinds))
        return layer, kinds[phase]

    def from_ids(self, ids: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor,
                 token_types: torch.Tensor | None = None, persistent: bool = True) -> torch.Tensor:
        """A BERT-style encoder's forward from its token ids: the kernel's first step computes the embeddings
        (word + token type + position, LayerNorm) that BertModel's module otherwise computes in ~5 kernels
        before it. positions: after the model's offset (XLM-R's); token_types: read when the model takes them."""
        if not self.w.post:
            raise ValueError("from_ids is for BERT-style encoders (their embeddings are computed in step 0)")
        residual = torch.empty(ids.shape[0], self.hidden, dtype=self.w.wqkv.dtype, device=ids.device)
        work = self.workspace(residual, positions, seq_ids, clone=False)
        work.ids, work.types = ids, token_types if token_types is not None else ids
        self.run(work, 0, self.steps(ids.shape[0]), persistent)
        return work.out

    def workspace(self, residual: torch.Tensor, positions: torch.Tensor, seq_ids: torch.Tensor,
                  clone: bool = True) -> Workspace:
        """The buffers of one forward over `residual` (cloned unless `clone` is False: the kernel updates it in
        place, layer by layer)."""
        t = residual.shape[0]
        if not 0 < t <= MAX_TOKENS:
            raise ValueError(f"{t} tokens: the persistent decoder takes 1 to {MAX_TOKENS}")

        def new(*shape, dtype=residual.dtype):
            return torch.empty(*shape, dtype=dtype, device=residual.device)

        tiles, d = self.tiles_at(t), self.head_dim
        residual = residual.clone(memory_format=torch.contiguous_format) if clone else residual
        return Workspace(residual=residual, positions=positions, seq_ids=seq_ids,
                         h=residual if self.w.post else new(t, self.hidden),  # post-norm: the residual is h
                         qkv=new(tiles.split_qkv, t, self.qkv_size, dtype=torch.float32),
                         heads=new(t, self.qkv_size) if tiles.heads else residual[:1],  # (unread without)
                         attn=new(t, self.heads * d), od=new(tiles.split_od, t, self.hidden, dtype=torch.float32),
                         act=new(t, self.inner), out=new(t, self.hidden),
                         rope=new(2, t, d // 2, dtype=torch.float32))

    def run(self, work: Workspace, first: int, last: int, persistent: bool = True,
            clock: torch.Tensor | None = None) -> None:
        """Steps [first, last) over `work` (step = layer * phases + phase; steps(T) - 1 is the final norm): one
        launch with barriers (persistent), or one launch a step. A run from a later step reads what the steps
        before it left in `work` (the tests check phase by phase)."""
        args, meta = self.kernel_args(work, first, last, persistent, clock)
        grid = (self.programs,)
        self.flags.zero_()
        if persistent:
            decoder_kernel[grid](*args, first, last, PERSISTENT=True, **meta)
        else:
            for step in range(first, last):
                decoder_kernel[grid](*args, step, step + 1, PERSISTENT=False, **meta)

    def kernel_args(self, work: Workspace, first: int = 0, last: int | None = None, persistent: bool = True,
                    clock: torch.Tensor | None = None) -> tuple[tuple, dict]:
        """decoder_kernel's arguments before `first, last` and its constexprs (with num_warps and num_stages) for
        a run over `work`: what run() launches, and what benchmarks.persistent_sass compiles for sm_90 without a
        GPU."""
        t, d = work.residual.shape[0], self.head_dim
        steps = self.steps(t)
        last = steps if last is None else last
        tiles, block_m = self.tiles_at(t), self.block_m(t)
        w = self.w
        args = (work.residual, work.h, work.qkv, work.heads, work.attn, work.od, work.act, work.out, w.wqkv, w.wo,
                w.wgu, w.wd, w.bqkv, w.bo, w.bgu, w.bd, w.ln1, w.ln1b, w.ln2, w.ln2b, w.final, w.final_b, w.qn, w.kn,
                work.positions, work.seq_ids, w.inv_freq, work.rope, self.flags,
                self.flags if clock is None else clock, *self._embed_args(work), t, self.eps, self.scale, steps - 1)
        meta = {"H": self.hidden, "BLOCK_H": triton.next_power_of_2(self.hidden), "NH": self.heads,
                "NKV": self.kv_heads, "HALF": d // 2, "INNER": self.inner, "BLOCK_M": block_m, "BN_QKV": tiles.qkv,
                "BN_O": tiles.o, "BN_GU": tiles.gate_up, "BN_D": tiles.down, "S_QKV": tiles.split_qkv,
                "S_OD": tiles.split_od, "BK": tiles.k, "BQ": min(block_m, tiles.queries),
                "BKEY": min(block_m, tiles.keys if tiles.heads else min(tiles.keys, 64)),  # own heads: 128 spill
                "CAUSAL": self.causal, "POST": w.post,
                "LAYER_NORM": w.layer_norm, "BIAS": w.bias, "ACT": w.act, "ROPE": w.rope,
                "NPROG_P2": flags_words(self.programs) - 1,
                "CLOCK": self._clock_kind(clock, persistent, first, last, steps), "FENCE": barrier_form(tiles),
                "PHASES": len(self.kinds(t)), "SPINS": self.spins, "STALL_EVERY": tiles.stall_every,
                "HEADS": tiles.heads, "BR": tiles.head_rows,
                "PREFETCH": 0 if INTERPRETED or w.wqkv.element_size() != 2 else PREFETCHES.index(tiles.prefetch),
                "EMBED": work.ids is not None, "TYPES": w.token_types, "num_warps": tiles.warps,
                "num_stages": tiles.stages}
        return args, meta

    def _clock_kind(self, clock: torch.Tensor | None, persistent: bool, first: int, last: int, steps: int) -> int:
        """The kernel's CLOCK for `clock` (__call__) in a forward of `steps`: 0 none, 1 program 0's [steps + 1], 2
        every program's [steps, programs, 4]; anything else is refused."""
        if clock is None:
            return 0
        if INTERPRETED:
            raise ValueError("a clock needs a GPU: Triton's interpreter has no %globaltimer")
        if not persistent or first != 0:
            raise ValueError("a clock needs the persistent kernel from step 0")
        if clock.dtype != torch.int64:
            raise ValueError(f"a clock is int64, not {clock.dtype}")
        if not clock.is_contiguous():
            raise ValueError(f"a clock is contiguous, not with strides {clock.stride()}")
        if clock.dim() == 1 and clock.numel() >= last + 1:
            return 1
        if clock.dim() == 3 and tuple(clock.shape) == (steps, self.programs, 4):
            return 2
        raise ValueError(f"a clock is [{last + 1}] (program 0's) or [{steps}, {self.programs}, 4] (every "
                         f"program's), not {list(clock.shape)}")

    def _embed_args(self, work: Workspace) -> tuple:
        """The kernel's ids, token types and embedding tables (placeholders when step 0 does not embed)."""
        w = self.w
        if work.ids is None:
            return (self.flags, self.flags, w.wemb, w.temb, w.pemb, w.eln, w.elnb)
        return (work.ids, work.types, w.wemb, w.temb, w.pemb, w.eln, w.elnb)


def flags_words(programs: int) -> int:
    """The grid barrier's int32 words for `programs`: their slots, the stall word, and the counter form's word at
    the power of two that covers the slots and the stall word (the kernel's NPROG_P2, this less one; a 128-byte
    line of its own from 31 programs; rose.layers.grid_sync)."""
    return (1 << programs.bit_length()) + 1  # 1 << (n - 1).bit_length() is n's next power of two, n = programs + 1


FENCES = {"acquire": 2, "fence": 1, "counter": 4}  # Tiles.barrier -> grid_barrier's FENCE (compiled)


def barrier_form(tiles: Tiles) -> int:
    """grid_barrier's FENCE for Tiles.barrier (FENCES); under Triton's interpreter, which has no inline assembly, 0
    for the fence form and 3 (acquire, volatile reads) else."""
    if INTERPRETED:
        return 0 if tiles.barrier == "fence" else 3
    return FENCES[tiles.barrier]


@dataclass
class Workspace:
    """One forward's buffers: the residual (updated in place), the norms' output h (the residual itself when
    post-norm), the QKV's and the o and down projections' float32 partials per slice of K ([slices, T, N]),
    attention's output, the MLP's activations (SiLU(gate) * up, or GELU(up)), the final norm's output, and the
    RoPE table (float32 cos and sin [2, T, head_dim / 2]), and the heads step's q, k and v [T, QKV] (Tiles.heads)."""

    residual: torch.Tensor
    positions: torch.Tensor
    seq_ids: torch.Tensor
    h: torch.Tensor
    qkv: torch.Tensor
    attn: torch.Tensor
    od: torch.Tensor
    act: torch.Tensor
    out: torch.Tensor
    rope: torch.Tensor
    heads: torch.Tensor
    ids: torch.Tensor | None = None  # from_ids: step 0 embeds these (BERT), with these token types
    types: torch.Tensor | None = None
