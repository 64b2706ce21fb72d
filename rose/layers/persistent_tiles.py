"""The persistent decoder's tiles (rose.layers.persistent_decoder): how each phase cuts its work, checked against a
model's shapes, the defaults fitted to shapes they do not divide, and the changes measured faster at one token
block of one model's shapes (the kernel compiles per token block, so each block may take its own)."""

from __future__ import annotations

from dataclasses import dataclass, replace

BARRIERS = ("acquire", "fence", "counter")  # the grid barrier's forms (rose.layers.grid_sync)
PREFETCHES = ("off", "own", "idle", "first")  # who asks a GEMM phase's weights into L2 a phase early (Tiles.prefetch)
WORDS = {"barrier": BARRIERS, "prefetch": PREFETCHES}  # the fields that take a word, and their words


@dataclass(frozen=True)
class Tiles:
    """Column tile widths per projection, slices of K (split-K) for the QKV and for the o and down projections,
    the K step, warps, pipeline stages, the least token block, queries per attention item and keys per step of
    its online softmax, and the weights' prefetch into L2 (benchmarks sweep these). Column tiles are at
    least 32 wide: 16-wide tiles of a 16-token block over 8 warps computed wrong on the H200 (Triton 3.6)."""

    qkv: int = 64
    o: int = 32
    gate_up: int = 32
    down: int = 32
    split_qkv: int = 2
    split_od: int = 4
    k: int = 128
    warps: int = 8
    stages: int = 3
    rows: int = 16  # the least token block (BLOCK_M): batches of fewer tokens are padded to it
    queries: int = 32  # queries per attention item (a q head's block of them)
    keys: int = 128  # keys per step of an attention item's online softmax (at most the token block)
    # the next GEMM phase's weights asked into L2 during the phase before it (off under the interpreter): "own", each
    # program the lines its own items will read; "idle", the programs with no work in that phase (a norm's rows,
    # attention's items) all of the weight between them, when they are enough to cover it; "first", the same
    # programs only each item's first K step (down's too, by the programs with no gate-up item) (persistent_kernels)
    prefetch: str = "off"
    heads: bool = True  # a step of its own that norms and rotates every head once, before attention
    head_rows: int = 16  # rows per item of the heads step
    barrier: str = "counter"  # the grid barrier's form (rose.layers.grid_sync): counter (the fastest), acquire, fence
    # the counter form's polls that also read the stall word: one in so many (a power of two; 64: a barrier 1.12 ->
    # 1.03 µs, a replay -0.007 to -0.014 ms at 16-128 tokens on an H100, NOTES "The barrier's counter form")
    stall_every: int = 64

    def check(self, hidden: int, qkv_size: int, q_size: int, inner: int) -> None:
        """Raise unless every projection's N is whole column tiles and its K whole slices of whole K steps
        (the kernel does not mask a partial tile)."""
        if min(self.qkv, self.o, self.gate_up, self.down) < 32:
            raise ValueError(f"column tiles under 32 wide: {self}")
        if self.stall_every < 1 or self.stall_every & (self.stall_every - 1):
            raise ValueError(f"stall_every must be a power of two: {self.stall_every}")
        for name in ("keys", "queries", "rows", "head_rows"):  # tl.arange and tl.dot sizes
            n = getattr(self, name)
            if n < 16 or n & (n - 1):
                raise ValueError(f"{name} must be a power of two from 16: {n}")
        for name, words in WORDS.items():
            if getattr(self, name) not in words:
                raise ValueError(f"{name} {getattr(self, name)!r}: one of {', '.join(words)}")
        if self.prefetch in ("own", "first") and self.k % 64:
            raise ValueError(f"prefetch asks whole 128-byte lines: a K step of {self.k} is not whole lines")
        projections = {"qkv": (qkv_size, hidden, self.qkv, self.split_qkv),  # name: (N, K, tile, slices)
                       "o": (hidden, q_size, self.o, self.split_od), "gate-up": (inner, hidden, self.gate_up, 1),
                       "down": (hidden, inner, self.down, self.split_od)}
        for name, (n, k, tile, split) in projections.items():
            if n % tile:
                raise ValueError(f"the {name} projection's {n} columns are not whole tiles of {tile}")
            if k % (split * self.k):
                raise ValueError(f"the {name} projection's K = {k} in {split} slices is not whole K steps of {self.k}")


def fit_tiles(hidden: int, qkv_size: int, q_size: int, inner: int) -> Tiles:
    """The default tiles if they fit these shapes (Qwen3-0.6B's and -4B's), else the first K step and slices of K
    that do (BERT-base: 768; all-MiniLM: 384 = 3 x 128)."""
    for k in (128, 64):
        for split_qkv in (2, 3, 1, 4):
            for split_od in (4, 3, 2, 1):
                tiles = Tiles(k=k, split_qkv=split_qkv, split_od=split_od)
                try:
                    tiles.check(hidden, qkv_size, q_size, inner)
                except ValueError:
                    continue
                return tiles
    raise ValueError(f"no tiles fit hidden {hidden}, qkv {qkv_size}, q {q_size}, inner {inner}")


# Changes to the fitted tiles at one token block (BLOCK_M), by the model's shapes (hidden, qkv, q, inner), each
# measured faster at that block on the device (benchmarks/NOTES.md, "Tiles by token block"). Never `rows`: the least
# block is the decoder's, whatever the block (`heads` may change: a forward's steps follow its block's tiles).
BLOCK_CHANGES: dict[tuple[int, int, int, int], dict[int, dict]] = {
    (1024, 4096, 2048, 3072): {  # Qwen3-0.6B (NOTES "Tiles by token block"): each change faster alone at its
        # block, on the H200 (11c8496: queries 16) and an H100 (aaa7fba: both); at 64 both lost. Each item's first K
        # step asked into L2 by the idle programs (prefetch "first", 2cf0444 on an H100: 16 tokens 0.845 -> 0.804 ms
        # a replay, 64 tokens 1.005 -> 0.987, 128 level: NOTES "The next phase's weights asked into L2")
        16: {"stages": 4, "prefetch": "first", "heads": False},  # (attention norms and rotates its own heads: -0.014
        # ms on top at 2cf0444, -3 % alone at 11c8496)
        32: {"prefetch": "first"},  # (e30f6f9, an H100: 0.972 -> 0.948 ms a replay)
        64: {"prefetch": "first"},
        128: {"queries": 16, "stages": 4},
    },
}
FIXED_FIELDS = ("rows",)


def block_tiles(tiles: Tiles, changes: dict[int, dict], hidden: int, qkv_size: int, q_size: int,
                inner: int) -> dict[int, Tiles]:
    """`tiles` with `changes` at their token blocks (the blocks not named take `tiles`), each checked against the
    shapes; a change of `rows`, or a block that is not a power of two from `tiles.rows`, is refused."""
    out = {}
    for block, change in changes.items():
        if block < tiles.rows or block & (block - 1):
            raise ValueError(f"token block {block}: blocks are powers of two from {tiles.rows} (the least block)")
        fixed = sorted(set(change) & set(FIXED_FIELDS))
        if fixed:
            raise ValueError(f"{', '.join(fixed)} cannot change by token block (the least block is the decoder's)")
        out[block] = replace(tiles, **change)
        out[block].check(hidden, qkv_size, q_size, inner)
    return out
