"""Triton softmax, long rows: step 3's online loop against variants of it, beside torch.softmax.

The rows that step 3 cannot hold in registers (past 32,768 elements) take its online loop: every row
is read twice, and the second read hits L2 only while the rows in flight fit there. The variants
change one thing each, named on{BLOCK}w{warps}e{evict}p{programs per SM}:
  BLOCK          elements per loop step (step 3: 8,192)
  warps          num_warps (step 3 autotunes 8 or 16)
  evict          1: the first pass loads evict_last and the second pass's loads and stores
                 evict_first, so the row waits in L2 for its second read; 0: no hints (step 3)
  programs/SM    the persistent grid: 1 or 2 programs an SM
and "packed w{warps}": the whole row held as loaded (16-bit), exp recomputed for the store.
`online` below is step 3's softmax_online_kernel copied with the EVICT switch added (an ablation
varies the step's code, so it keeps its own copy rather than patching the step).
Each is checked against an fp64 softmax, then all are timed in turns with the bench's method (CUDA
graph replays, L2 flushed, median; rosetta.timing.measure_in_turns). On a GPU box, from the
repository root: python bench/ablations/softmax_triton_long_rows.py
"""
import torch, triton, triton.language as tl, rosetta
from rosetta.timing import Flush, measure_in_turns
NSM = torch.cuda.get_device_properties(0).multi_processor_count

@triton.jit
def online(x_ptr, out_ptr, rows, cols, stride, BLOCK: tl.constexpr, EVICT: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    for row in range(tl.program_id(0).to(tl.int64), rows, tl.num_programs(0)):
        x_row = x_ptr + row * stride
        out_row = out_ptr + row * cols
        m = tl.full([BLOCK], -float("inf"), tl.float32)
        d = tl.zeros([BLOCK], tl.float32)
        for start in range(0, cols, BLOCK):
            if EVICT:
                x = tl.load(x_row + start + offs, mask=start + offs < cols, other=-float("inf"), eviction_policy="evict_last").to(tl.float32)
            else:
                x = tl.load(x_row + start + offs, mask=start + offs < cols, other=-float("inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            shift = tl.where(m_new == -float("inf"), 0.0, m_new)
            d = d * tl.exp(m - shift) + tl.exp(x - shift)
            m = m_new
        m_row = tl.max(m, axis=0)
        shift = tl.where(m_row == -float("inf"), 0.0, m_row)
        inv = 1.0 / tl.sum(d * tl.exp(m - shift), axis=0)
        for start in range(0, cols, BLOCK):
            mask = start + offs < cols
            if EVICT:
                x = tl.load(x_row + start + offs, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
                tl.store(out_row + start + offs, (tl.exp(x - m_row) * inv).to(out_ptr.dtype.element_ty), mask=mask, eviction_policy="evict_first")
            else:
                x = tl.load(x_row + start + offs, mask=mask, other=0.0).to(tl.float32)
                tl.store(out_row + start + offs, (tl.exp(x - m_row) * inv).to(out_ptr.dtype.element_ty), mask=mask)

@triton.jit
def packed_row(x_ptr, out_ptr, rows, cols, stride, BLOCK: tl.constexpr):
    # the whole row held as loaded (16-bit), exp recomputed for the store
    offs = tl.arange(0, BLOCK)
    mask = offs < cols
    for row in range(tl.program_id(0).to(tl.int64), rows, tl.num_programs(0)):
        x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
        m = tl.max(x, axis=0).to(tl.float32)
        inv = 1.0 / tl.sum(tl.exp(x.to(tl.float32) - m), axis=0)
        tl.store(out_ptr + row * cols + offs, (tl.exp(x.to(tl.float32) - m) * inv).to(out_ptr.dtype.element_ty), mask=mask)

flush = Flush("read")
for rows, cols, dt in ((4096, 50257, torch.bfloat16), (512, 50257, torch.bfloat16), (64, 50257, torch.bfloat16),
                       (4096, 65536, torch.bfloat16), (4096, 50257, torch.float32)):
    x = torch.randn(rows, cols, device="cuda", dtype=dt) * 3
    ref = torch.softmax(x.double(), -1)
    subjects, names = [[lambda: torch.softmax(x, -1)]], ["torch"]
    subjects.append([lambda: rosetta.softmax(x, step=3)]); names.append("step3")
    outs = {}
    def add(name, fn):
        try:
            y = fn(); torch.cuda.synchronize()
            err = (y.double() - ref).abs().max().item()
            if not err < 2e-2 * ref.max().item() + 1e-6: print(f"  WRONG {name}: {err:.3g}"); return
            subjects.append([fn]); names.append(name)
        except Exception as e:
            print(f"  ERR {name}: {type(e).__name__} {str(e)[:150]}")
    for block in (4096, 8192, 16384):
        for warps in (8, 16):
            for evict in (0, 1):
                for per_sm in (1, 2):
                    if per_sm * warps > 32: continue
                    out = torch.empty_like(x)
                    add(f"on{block}w{warps}e{evict}p{per_sm}", lambda out=out, block=block, warps=warps, evict=evict, per_sm=per_sm:
                        online[(min(rows, NSM * per_sm),)](x, out, rows, cols, cols, BLOCK=block, EVICT=evict, num_warps=warps) and out)
    if dt != torch.float32 and cols <= 65536:
        for warps in (16, 32):
            out = torch.empty_like(x)
            add(f"packed w{warps}", lambda out=out, warps=warps: packed_row[(min(rows, NSM * (32 // warps)),)](x, out, rows, cols, cols, BLOCK=triton.next_power_of_2(cols), num_warps=warps) and out)
    res = measure_in_turns(subjects, flush)
    t = sorted(((r["p50_ms"] * 1e3, n) for n, r in zip(names, res)))
    tt = dict((n, v) for v, n in t)
    print(f"{rows}x{cols} {str(dt)[6:]}: torch {tt['torch']:.1f} step3 {tt['step3']:.1f} | best: " + ", ".join(f"{n} {v:.1f} ({tt['torch']/v:.2f}x)" for v, n in t[:6]), flush=True)
