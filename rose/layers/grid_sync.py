"""A grid-wide barrier for persistent Triton kernels (rose.layers.persistent_decoder: one program per SM, every
program resident at once), bounded so that a grid that cannot all be resident ends instead of hanging, and the
GPU clock read between its phases. Each program writes how many steps it finished into its own slot (an
exchange, with release order), spins on plain volatile reads of every slot until all reach the count, then
fences (fence.acq_rel.gpu on every thread) so that its later loads see what the others wrote."""

import triton
import triton.language as tl


@triton.jit
def globaltimer():
    """The GPU's clock in ns (%globaltimer): what --phases reads after each barrier."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                     pack=1)

@triton.jit
def _fence():
    """fence.acq_rel.gpu on every thread: what the other programs released before their arrival is visible to
    this program's later loads, L1 included."""
    tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def grid_barrier(flags_ptr, pid, nprog, target, NPROG_P2: tl.constexpr, FENCE: tl.constexpr, SPINS: tl.constexpr):
    """Wait until every program's slot reads at least `target` (module docstring), or the stall word (the slot
    after the programs', read in the same load: NPROG_P2 covers nprog + 1) is set: a program that has waited
    SPINS reads sets it, and every later wait of every program ends at once, so a grid that is not all resident
    ends in poisoned rows instead of a hang. Whether to wait on is decided from reductions over the load, the same
    in every thread (a value each thread read for itself could differ between warps, and a warp leaving the loop
    early would pair the program's bar.syncs wrongly). FENCE: the acquire fence (off only under Triton's
    interpreter, which has no inline assembly and runs programs one at a time)."""
    tl.debug_barrier()  # this program's stores before its arrival
    tl.atomic_xchg(flags_ptr + pid, target, sem="release", scope="gpu")
    offs = tl.arange(0, NPROG_P2)
    is_slot = offs < nprog
    is_stall = offs == nprog
    behind = nprog
    stalled = 0
    spins = 0
    while (behind > 0) & (stalled == 0):  # plain reads from L2 while waiting: no atomic traffic
        seen = tl.load(flags_ptr + offs, mask=offs <= nprog, other=0, volatile=True)
        behind = tl.sum((is_slot & (seen < target)).to(tl.int32), axis=0)
        spins += 1
        late = (spins >= SPINS) & (behind > 0)
        if late:
            tl.atomic_xchg(flags_ptr + nprog, 1, sem="relaxed", scope="gpu")
        stalled = tl.max(tl.where(is_stall, seen, 0), axis=0) | late.to(tl.int32)
    if FENCE:
        _fence()
    tl.debug_barrier()
