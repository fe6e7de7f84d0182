"""Test inputs for every op, from its spec (the shapes, each with its reason, live in
bindings/ops/<op>.py): fresh random data per call, never zeros."""

import torch

from rosetta.ops import SPECS

# >= 2^31 elements (64-bit offsets); 16-bit dtypes keep each tensor at 4 GiB.
HUGE_NUMEL = 2**31 + 17


def make_inputs(op, shape, dtype, device, gen, direction="forward", contiguous=True):
    """Fresh random inputs; non-contiguous ones view every other column of a wider tensor."""
    d = SPECS[op].directions()[direction]
    if contiguous:
        return d.make_inputs(shape, dtype, device, gen)
    wide = (*shape[:-1], 2 * shape[-1])
    return tuple(t[..., ::2] for t in d.make_inputs(wide, dtype, device, gen))


def poisoned_output(op, inputs, direction="forward"):
    """The output buffer a kernel must overwrite entirely: NaN wherever it fails to write."""
    return SPECS[op].directions()[direction].poisoned(*inputs)


def strided_cases(op, dtype, device, gen):
    """(name, inputs) of views that are not plain contiguous tensors, for every op:
    every other column, storage that starts one element in (misaligned for 16-byte vectors),
    and, for 2-D ops, transposes."""
    spec = SPECS[op]
    d = spec.forward
    big = str(device).startswith("cuda")  # the interpreter runs program by program: keep it small
    shape = {"vector_add": (999, 1001) if big else (33, 41), "reduce_sum": (999, 1001) if big else (33, 41),
             "matmul": (67, 129, 35) if big else (9, 17, 5), "linear_gelu": (67, 136, 40) if big else (9, 16, 8),
             "attention": (2, 3, 77, 65, 64) if big else (1, 2, 9, 7, 64)}.get(op, (37, 1001) if big else (5, 41))
    if op == "linear_gelu":
        m, k, n = shape
        a, w, b = d.make_inputs((m, 2 * k, 2 * n), dtype, device, gen)
        cases = [("every other column", (a[:, ::2], w[::2, ::2], b[::2]))]
        a, w = d.make_inputs((k, m, n), dtype, device, gen)[0], d.make_inputs((m, n, k), dtype, device, gen)[1]
        cases.append(("a.t() and weight.t() (nn.Linear's (N, K) weight)", (a.t(), w.t(), b[::2].contiguous())))
        a, w, b = d.make_inputs((m, k + 1, n + 1), dtype, device, gen)
        cases.append(("one element in", (a[:, 1:], w[1:, 1:], b[1:])))
    elif op == "attention":
        bsz, h, sq, sk, dim = shape
        q, k, v = (torch.randn((bsz, s_, h, dim), generator=gen, device=device).to(dtype) for s_ in (sq, sk, sk))
        cases = [("(B, S, H, D) storage, heads transposed in", tuple(t.transpose(1, 2) for t in (q, k, v)))]
        q, k, v = d.make_inputs((bsz, h, sq, sk, 2 * dim), dtype, device, gen)
        cases.append(("every other head_dim half: rows 2 D apart", (q[..., :dim], k[..., :dim], v[..., :dim])))
        # column-major (S, D) matrices on 16-byte pitches: the tma layout would take them as they
        # are, the row-box kernels cannot (tma_rows copies them)
        q, k, v = (torch.randn((bsz, h, dim, -(-s_ // 8) * 8), generator=gen, device=device).to(dtype)[..., :s_]
                   for s_ in (sq, sk, sk))
        cases.append(("sequence-major storage: head_dim strided", tuple(t.transpose(-1, -2) for t in (q, k, v))))
    elif op == "matmul":
        m, k, n = shape
        wa, wb = d.make_inputs((m, 2 * k, 2 * n), dtype, device, gen)
        cases = [("every other column", (wa[:, ::2], wb[::2, ::2]))]
        a, b = d.make_inputs((k, m, n), dtype, device, gen)[0], d.make_inputs((m, n, k), dtype, device, gen)[1]
        cases.append(("a.t() and b.t()", (a.t(), b.t())))
        wa, wb = d.make_inputs((m, k + 1, n + 1), dtype, device, gen)
        cases.append(("one element in: a[:, 1:], b[1:, 1:]", (wa[:, 1:], wb[1:, 1:])))
        # transposes whose rows are whole 16-byte units: what the TMA steps read in place
        m, k, n = (72, 136, 40) if big else (8, 16, 8)
        a, b = d.make_inputs((k, m, n), dtype, device, gen)[0], d.make_inputs((m, n, k), dtype, device, gen)[1]
        cases.append(("a.t() and b.t(), 16-byte rows", (a.t(), b.t())))
    else:
        cases = [("every other column", make_inputs(op, shape, dtype, device, gen, contiguous=False))]
        wide = d.make_inputs((*shape[:-1], shape[-1] + 1), dtype, device, gen)
        cases.append(("one element in: x[..., 1:]", tuple(t[..., 1:] for t in wide)))
        if op == "softmax":
            cases.append(("transposed", (d.make_inputs(shape[::-1], dtype, device, gen)[0].t(),)))
    return cases
