"""What the Triton softmax steps that split a long row over programs (steps 4 and 5) share: the
order in which programs claim their (row, chunk), and the meeting of a row's chunks. Both run on
counters from triton_launch.tickets (zeroed once per stream, never again by the host), so both
leave every counter they use at zero: int32[rows + 1], the row counters, then the ticket."""
import triton
import triton.language as tl


@triton.jit
def claim(sync_ptr, rows, chunks, SPLIT: tl.constexpr):
    """Which (row, chunk) this program does. Split rows take an atomic ticket (sync_ptr[rows]):
    work is claimed in order, so a program only ever waits for chunks already being worked on.
    The last claim sets the ticket counter back to zero: every program has drawn by then."""
    if SPLIT:
        unit = tl.atomic_add(sync_ptr + rows, 1, sem="relaxed")
        if unit == tl.num_programs(0) - 1:
            tl.atomic_xchg(sync_ptr + rows, 0, sem="relaxed")
    else:
        unit = tl.program_id(0)
    return (unit // chunks).to(tl.int64), unit % chunks


@triton.jit
def meet(counter_ptr, peers):
    """common.wait_for_peers, leaving the counter at zero: the last of the row's programs to
    arrive sets it back to zero, and the others wait until it reads `peers` or zero. A waiting
    program has arrived, so it reads zero only after the last arrival's reset; the last arrival
    acquires every earlier one and releases the zero, so the partials stored before each arrival
    are visible to every reader either way. Read them with cache_modifier=".cg" (from L2)."""
    tl.debug_barrier()  # every thread's partial store is ordered before the release below
    if tl.atomic_add(counter_ptr, 1, sem="acq_rel") == peers - 1:
        tl.atomic_xchg(counter_ptr, 0, sem="release")
    else:
        seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
        while (seen != 0) & (seen < peers):
            seen = tl.atomic_add(counter_ptr, 0, sem="acquire")
    tl.debug_barrier()  # thread 0 has seen them all: so may the others
