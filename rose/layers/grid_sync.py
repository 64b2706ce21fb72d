"""A grid-wide barrier for persistent Triton kernels (rose.layers.persistent_decoder: one program per SM, every program
resident at once), bounded so that a grid that cannot all be resident ends instead of hanging, and the GPU clock
read between its phases. In the slot forms each program writes how many barriers it passed into its own slot (an
exchange, with release order) and spins on reads of every slot until all reach the count. Its later loads must see
what the others wrote before their arrival: in the ACQUIRE form every read of a slot is ld.acquire.gpu, so the read
that sees a program's count synchronizes with that program's release (PTX's acquire pattern, in the thread that read
it) and the closing bar.sync carries it to the program's other threads; the FENCE form spins on volatile reads and
then runs fence.acq_rel.gpu on every thread (each thread fences after its own reads: a fence in one thread would not
make another thread's relaxed read an acquire). The COUNTER form (FENCE 4) is the one cooperative groups' grid sync
takes: after a bar.sync, one thread a program adds its arrival to one word (an atom.add with release order) and
polls that word alone with ld.acquire.gpu, then a bar.sync lets its program go; a poll is one load of one line,
where the slot forms read every slot from every warp and reduce across the warps (shared memory and a bar.sync) each
spin. NOTES, "One persistent kernel" and "The barrier's counter form", has what each costs."""

import triton
import triton.language as tl


@triton.jit
def globaltimer():
    """The GPU's clock in ns (%globaltimer), the same on every SM: the decoder's clocks (program 0's after each
    barrier, or every program's around its work)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False,
                                     pack=1)

@triton.jit
def sm_cycles():
    """This SM's cycle counter (%clock64): finer than %globaltimer within one program, but not comparable
    between SMs (the per-program clock pairs the two)."""
    return tl.inline_asm_elementwise("mov.u64 $0, %clock64;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _fence():
    """fence.acq_rel.gpu on every thread: what the other programs released before their arrival is visible to
    this program's later loads, L1 included."""
    tl.inline_asm_elementwise("fence.acq_rel.gpu; mov.u32 $0, 0;", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _acquired(ptrs):
    """ld.acquire.gpu of each 32-bit word (no mask: every pointer must be valid)."""
    return tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [ptrs], dtype=tl.int32,
                                     is_pure=False, pack=1)


def _counter_asm(stall_every: int) -> str:
    """_counter_wait's PTX: thread 0 arrives and polls; every stall_every-th poll (1: each) also reads the stall
    word and the bound ($5 = stall_every - 1 masks the polls' count when above 1)."""
    skip = "" if stall_every == 1 else """
        and.b32 r_seen, r_spins, $5;
        setp.ne.u32 p_skip, r_seen, 0;
        @p_skip bra POLL;"""
    return """{
        .reg .pred p_skip, p_done;
        .reg .b32 r_tid, r_seen, r_spins;
        mov.u32 $0, 0;
        mov.u32 r_tid, %tid.x;
        setp.ne.u32 p_skip, r_tid, 0;
        @p_skip bra END;
        atom.add.release.gpu.global.u32 r_seen, [$1], 1;
        mov.u32 r_spins, 0;
        POLL:
        ld.acquire.gpu.global.u32 r_seen, [$1];
        setp.ge.u32 p_done, r_seen, $3;
        @p_done bra END;
        add.u32 r_spins, r_spins, 1;""" + skip + """
        ld.volatile.global.u32 r_seen, [$2];
        setp.ne.u32 p_done, r_seen, 0;
        @p_done bra STALLED;
        setp.lt.u32 p_done, r_spins, $4;
        @p_done bra POLL;
        atom.relaxed.gpu.global.exch.b32 r_seen, [$2], 1;
        STALLED:
        mov.u32 $0, 1;
        END:
        }"""


_COUNTER_EACH_POLL = tl.constexpr(_counter_asm(1))
_COUNTER_SOME_POLLS = tl.constexpr(_counter_asm(2))  # the mask is an operand: one text for every stall_every > 1


@triton.jit
def _counter_wait(counter_ptr, stall_ptr, count, spins, STALL_EVERY: tl.constexpr):
    """The COUNTER form's arrival and wait, in thread 0 of the program alone (the others skip it and wait at the
    bar.sync after): add 1 to the counter (release), then poll it with acquire loads until it reads `count`; the
    stall word is read every STALL_EVERY-th poll (a power of two; 1: each poll, a second L2 round trip a spin),
    and a wait of `spins` polls sets it. Returns 1 where the wait ended stalled (thread 0), else 0. Labels are
    local to the asm's braces, as CUTLASS's waits have them."""
    if STALL_EVERY == 1:
        return tl.inline_asm_elementwise(_COUNTER_EACH_POLL, "=r,l,l,r,r", [counter_ptr, stall_ptr, count, spins],
                                         dtype=tl.int32, is_pure=False, pack=1)
    else:
        return tl.inline_asm_elementwise(_COUNTER_SOME_POLLS, "=r,l,l,r,r,r",
                                         [counter_ptr, stall_ptr, count, spins, STALL_EVERY - 1], dtype=tl.int32,
                                         is_pure=False, pack=1)


@triton.jit
def grid_barrier(flags_ptr, pid, nprog, target, NPROG_P2: tl.constexpr, FENCE: tl.constexpr, SPINS: tl.constexpr,
                 STALL_EVERY: tl.constexpr = 1):
    """Wait until every program's slot reads at least `target` (module docstring), or the stall word (the slot
    after the programs', read in the same load: NPROG_P2 covers nprog + 1) is set: a program that has waited
    SPINS reads sets it, and every later wait of every program ends at once, so a grid that is not all resident
    ends in poisoned rows instead of a hang. In the slot forms, whether to wait on is decided from reductions over
    the load, the same in every thread (a value each thread read for itself could differ between warps, and a warp
    leaving the loop early would pair the program's bar.syncs wrongly); in the counter form thread 0 alone waits
    and decides, and the others wait for it at the bar.sync. FENCE: 2 the acquire form (one reduction a spin: the
    count of slots behind and the stall word in one sum), 1 the fence form (two), 0 the fence form and 3 the
    acquire form with volatile reads and no fence: only under Triton's interpreter, which has no inline assembly
    and runs programs one at a time (so the acquire form's reduction and stall word are tested there); 4 the
    counter form (the word after NPROG_P2's slots counts every program's arrivals: `target` barriers in, it reads
    target x nprog; STALL_EVERY: its polls that also read the stall word, one in so many). `target`: the barriers
    passed since the flags were zeroed, this one included."""
    tl.debug_barrier()  # this program's stores before its arrival
    if FENCE == 4:
        _counter_wait(flags_ptr + NPROG_P2, flags_ptr + nprog, target * nprog, SPINS, STALL_EVERY)
    else:
        _slots_wait(flags_ptr, pid, nprog, target, NPROG_P2, FENCE, SPINS)
    tl.debug_barrier()


@triton.jit
def _slots_wait(flags_ptr, pid, nprog, target, NPROG_P2: tl.constexpr, FENCE: tl.constexpr, SPINS: tl.constexpr):
    """The slot forms' arrival and wait (grid_barrier), in every thread."""
    tl.atomic_xchg(flags_ptr + pid, target, sem="release", scope="gpu")
    offs = tl.arange(0, NPROG_P2)
    is_slot = offs < nprog
    is_stall = offs == nprog
    behind = nprog
    stalled = 0
    spins = 0
    while (behind > 0) & (stalled == 0):  # reads from L2 while waiting: no atomic traffic
        if FENCE >= 2:
            if FENCE == 2:
                seen = tl.where(offs <= nprog, _acquired(flags_ptr + tl.minimum(offs, nprog)), 0)
            else:
                seen = tl.load(flags_ptr + offs, mask=offs <= nprog, other=0, volatile=True)
            state = tl.sum((is_slot & (seen < target)).to(tl.int32) + (is_stall & (seen != 0)).to(tl.int32) * 65536,
                           axis=0)  # slots behind (< 65536 programs), and the stall word above them
            behind = state % 65536
            stalled = state // 65536
        else:
            seen = tl.load(flags_ptr + offs, mask=offs <= nprog, other=0, volatile=True)
            behind = tl.sum((is_slot & (seen < target)).to(tl.int32), axis=0)
            stalled = tl.max(tl.where(is_stall, seen, 0), axis=0)
        spins += 1
        late = (spins >= SPINS) & (behind > 0)
        if late:
            tl.atomic_xchg(flags_ptr + nprog, 1, sem="relaxed", scope="gpu")
        stalled = stalled | late.to(tl.int32)
    if FENCE == 1:
        _fence()
