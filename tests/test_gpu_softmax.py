"""softmax beyond the shared GPU checks of tests/test_gpu.py: special values (-inf, +inf, NaN,
huge) in rows from 5 elements to long enough to reach every long-row path (online loops,
clusters, split rows), forward and backward, against what torch gives on the same rows; and strided inputs to the
backward. NaN and infinities must land where torch's do, exactly."""
import pytest
import torch

import rosetta
from cases import make_inputs, poisoned_output
from helpers import GPU, assert_matches_reference
from rosetta.dispatch import fits
from rosetta.ops import SPECS
from rosetta.triton_kernels.common import sm_count

pytestmark = pytest.mark.gpu
SPEC = SPECS["softmax"]
STEPS = rosetta.variants("softmax")
STEP_DTYPES = [(v, d) for v in STEPS for d in v.dtypes]
INF, NAN = float("inf"), float("nan")
SPLIT_TILES = "past SMs x 4,096"  # a length known only on the GPU: see row_length

# Row lengths the special values are placed in, and the paths each reaches (fp32 / 16-bit). The
# lengths share test_gpu.py's Triton
# specialisations (777, 5000 ~ 4097, 50000, 262144), so a run after it compiles little anew.
LENGTHS = (
    # shorter than a vector of most lanes: every step's masked, single-chunk path
    5,
    # odd: CUDA steps 5-8's register tiles, 16-bit a warp per row (4 vectors a lane), fp32 blocks
    # of 128 x 8; Triton steps 3-4 tiles of 2 rows x 1,024, steps 1-2 one block of 1,024
    777,
    # CUDA steps 5-8's block-per-row register tiles (256 x 32); CUDA steps 2-4's block loops;
    # Triton step 2's loop (4,096 + 904); Triton steps 1, 3, 4 one tile of 8,192
    5000,
    # CUDA step 5's row in shared memory (forward; 16-bit backward), step 6's cluster, step 7's (fp32:
    # 4 CTAs; 16-bit takes step 4's online kernels), step 8's (7 / 4 CTAs, a shorter last slice);
    # Triton steps 2-3's online loops, step 4's split row (13 fp32 chunks, 7 16-bit forward)
    50000,
    # 2^18, aligned: CUDA steps 7-8's 16-CTA clusters, Triton step 4's 64 (32 16-bit) chunks of
    # one tile each, as benchmarked
    262144,
    # 2 x SMs x 4,096 + 3: Triton step 4's chunks of several tiles (a row past SMs x its chunk
    # tile: 3 fp32 / 2 16-bit forward tiles a chunk), the only GPU shape that reaches that loop;
    # CUDA steps 7-8 and 5 fall back to step 4's online kernels (odd, too long for 16 CTAs)
    SPLIT_TILES,
)


def row_length(length) -> int:
    return 2 * sm_count(GPU) * 4096 + 3 if length == SPLIT_TILES else length


def huge(dtype) -> float:
    """A finite value far above N(0, 4) data: exp(x - huge) underflows to exactly 0. fp16 tops out
    at 65,504, so 1e30 would round to +inf there and turn the huge rows into +inf rows (all NaN,
    tested apart); 6e4 is finite in fp16 and still leaves exp(-6e4) = 0. bf16 has fp32's range."""
    return 6e4 if dtype == torch.float16 else 1e30


def special_rows(n: int, dtype, gen) -> dict[str, torch.Tensor]:
    """name -> one fp32 row of n elements (rounded to dtype by the caller). Specials sit at the
    first, middle and last element and over whole halves, so that whichever chunk, slice or loop
    block of a long row holds them (the last one: the ragged tail), its partial must combine
    with the others the way torch's one pass does."""
    big = huge(dtype)

    def randn():
        return torch.randn(n, generator=gen, device=GPU).mul_(2)

    def full(value):
        return torch.full((n,), value, device=GPU)

    def put(row, at, value):
        row[at] = value
        return row

    rows = {
        "ordinary": randn(),
        "all -inf": full(-INF),  # 0/0: NaN everywhere, as torch
        # every chunk / slice but the last is all -inf: each must contribute exp-sum 0, not NaN
        "-inf but the last": put(full(-INF), -1, 0.5),
        "-inf first half": put(randn(), slice(0, n // 2), -INF),  # exactly 0 there
        "-inf second half": put(randn(), slice(n // 2, None), -INF),
        "-inf every third": put(randn(), slice(1, None, 3), -INF),  # masked positions: exactly 0
        "+inf first": put(randn(), 0, INF),  # inf - inf: the whole row NaN
        "+inf last": put(randn(), -1, INF),  # in the ragged tail / the last slice
        "+inf among -inf": put(full(-INF), n // 2, INF),  # NaN
        "NaN middle": put(randn(), n // 2, NAN),  # NaN poisons its row, whichever chunk holds it
        "NaN last": put(randn(), -1, NAN),
        "NaN and -inf": put(put(randn(), 0, -INF), n // 2, NAN),
        "huge, all equal": full(big),  # uniform 1/n: the max is subtracted first
        "-huge, all equal": full(-big),  # uniform
        "one huge": put(randn(), n // 3, big),  # one-hot: exactly 1 there, exactly 0 elsewhere
        "-huge but the last": put(full(-big), -1, 0.0),  # one-hot at the last element
        "huge and -huge interleaved": put(full(-big), slice(0, None, 2), big),  # 1/ceil(n/2) on evens
    }
    return rows


def special_input(n: int, dtype, gen) -> tuple[list[str], torch.Tensor]:
    rows = special_rows(n, dtype, gen)
    return list(rows), torch.stack(list(rows.values())).to(dtype)


def assert_matches_torch(v, direction, names, inputs, out, ref):
    """NaN exactly where torch has NaN (named by row), then the op's elementwise gate against
    torch's own result in fp64: infinities equal, finite values within the dtype's tolerance."""
    d = SPEC.directions()[direction]
    where = f"{v.label} {direction} {inputs[0].dtype} rows of {out.shape[-1]}"
    assert out.shape == ref.shape and out.dtype == inputs[0].dtype, f"{where}: {out.shape} {out.dtype}"
    got_nan, want_nan = out.isnan(), ref.isnan()
    for i, name in enumerate(names):
        if not torch.equal(got_nan[i], want_nan[i]):
            first = int((got_nan[i] != want_nan[i]).nonzero()[0])
            raise AssertionError(f"{where}, row '{name}': NaN at {int(got_nan[i].sum())} positions, torch at "
                                 f"{int(want_nan[i].sum())}; first difference at column {first}: got "
                                 f"{float(out[i, first])}, torch {float(ref[i, first])}")
    err, worst, got, expected = d.error_report(out, ref, inputs)
    tol = d.tolerance[inputs[0].dtype]
    row, col = divmod(worst, out.shape[-1]) if worst >= 0 else (0, -1)
    assert err <= tol, (f"{where}: error {err:.3g} > {tol:g} in row '{names[row]}', column {col}: "
                        f"got {got}, torch {expected}")


def torch_backward(y, dy):
    """What torch's softmax backward gives on the same rows, in fp64."""
    return torch.ops.aten._softmax_backward_data(dy.double(), y.double(), -1, torch.float64)


# ---- forward: special values in long rows ------------------------------------------------------

@pytest.mark.parametrize("v,dtype", STEP_DTYPES, ids=lambda p: getattr(p, "label", str(p)))
def test_forward_special_values_in_long_rows(gen, v, dtype):
    ran = 0
    for length in LENGTHS:
        names, x = special_input(row_length(length), dtype, gen)
        if not fits(v, (x,)):  # Triton step 1 past 32,768: its refusal is tested in test_gpu.py
            continue
        assert_matches_torch(v, "forward", names, (x,), v(x), torch.softmax(x.double(), -1))
        ran += 1
    assert ran, f"{v.label} took none of the lengths"


# ---- backward: special values in y (real softmax outputs) and in dy -----------------------------

def backward_special_input(n: int, dtype, gen) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """y: the softmax (computed in fp32 by torch) of each forward special row, so NaN rows, exact
    zeros, one-hot and uniform rows; dy random. Then ordinary y with special finite-or-NaN dy."""
    names, x = special_input(n, dtype, gen)
    y = torch.softmax(x.float(), -1)
    dy = torch.randn(y.shape, generator=gen, device=GPU)
    big = huge(dtype)
    ordinary = torch.softmax(torch.randn(n, generator=gen, device=GPU).mul_(2), -1)
    special_dy = {
        "dy NaN middle": (n // 2, NAN),  # the dot is NaN: the whole row NaN, y = 0 positions too
        "dy NaN last": (-1, NAN),
        "dy one huge": (n // 3, big),  # a dot dominated by one term, finite
        "dy huge, all equal": (slice(None), big),  # dy - dot cancels: y (dy - dot) is small
    }
    ys, dys = [y], [dy]
    for name, (at, value) in special_dy.items():
        g = torch.randn(n, generator=gen, device=GPU)
        g[at] = value
        ys.append(ordinary[None])
        dys.append(g[None])
        names.append(name)
    return names, torch.cat(ys).to(dtype), torch.cat(dys).to(dtype)


def infinite_gradient_input(n: int, dtype, gen) -> tuple[list[str], torch.Tensor, torch.Tensor]:
    """An infinite upstream gradient: torch's dot is +-inf, so dx is -+inf where y > 0 and NaN at
    the infinity (inf - inf) and wherever y = 0 (0 x inf); a kernel must not turn the row into
    NaN everywhere, nor leave finite values."""
    ordinary = torch.softmax(torch.randn(n, generator=gen, device=GPU).mul_(2), -1)
    zeros_first_half = ordinary.clone()
    zeros_first_half[: n // 2] = 0.0  # y = 0 where x was -inf (the rest no longer sums to 1: no matter)
    cases = {
        "dy +inf at n/3": (ordinary, [(n // 3, INF)]),
        "dy -inf first": (ordinary, [(0, -INF)]),
        "dy +inf last": (ordinary, [(-1, INF)]),
        "dy +inf where y = 0": (zeros_first_half, [(0, INF)]),  # 0 x inf: the dot, and the row, NaN
        "dy +inf and -inf": (ordinary, [(1, INF), (-2, -INF)]),  # NaN
    }
    names, ys, dys = [], [], []
    for name, (y, spots) in cases.items():
        g = torch.randn(n, generator=gen, device=GPU)
        for at, value in spots:
            g[at] = value
        names.append(name)
        ys.append(y)
        dys.append(g)
    return names, torch.stack(ys).to(dtype), torch.stack(dys).to(dtype)


@pytest.mark.parametrize("rows", [backward_special_input, infinite_gradient_input], ids=["special", "infinite dy"])
@pytest.mark.parametrize("v,dtype", STEP_DTYPES, ids=lambda p: getattr(p, "label", str(p)))
def test_backward_special_values(gen, v, dtype, rows):
    ran = 0
    for length in LENGTHS:
        names, y, dy = rows(row_length(length), dtype, gen)
        if not fits(v, (y, dy)):
            continue
        assert_matches_torch(v, "backward", names, (y, dy), v.backward(y, dy), torch_backward(y, dy))
        ran += 1
    assert ran, f"{v.label} took none of the lengths"


# ---- backward: strided inputs ----------------------------------------------------------------

def strided_backward_cases(shape, dtype, gen):
    """(name, (y, dy)) views the backward must take: copied to its layout (every other column,
    transposed) or read in place with their own row strides (one element in: rows not on 16
    bytes, so CUDA steps 7-8 fall back; padded rows: a row stride past cols but on 16 bytes, so
    the vector and cluster paths run with it; y and dy with different strides)."""
    d = SPEC.backward
    rows, cols = shape
    cases = [("every other column", make_inputs("softmax", shape, dtype, GPU, gen, "backward", contiguous=False)),
             ("transposed", tuple(t.t() for t in d.make_inputs((cols, rows), dtype, GPU, gen)))]
    wide = d.make_inputs((rows, cols + 1), dtype, GPU, gen)
    cases.append(("one element in: [:, 1:]", tuple(t[:, 1:] for t in wide)))
    padded = d.make_inputs((rows, cols + 8), dtype, GPU, gen)  # 8 elements: 16 bytes in 16-bit, 32 in fp32
    cases.append(("padded rows: [:, :cols] of cols + 8", tuple(t[:, :cols] for t in padded)))
    y = d.make_inputs(shape, dtype, GPU, gen)[0]
    cases.append(("y contiguous, dy one element in", (y, wide[1][:, 1:])))
    return cases


# (37, 777): short rows, register tiles; (3, 131072): the long-row paths (clusters, split rows).
# Row lengths of test_gpu.py's shapes: the copied and padded cases reuse its Triton kernels.
# fp32 and bf16: both vector widths (fp16 runs bf16's code with another conversion).
@pytest.mark.parametrize("shape", [(37, 777), (3, 131072)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("v", STEPS, ids=lambda v: v.label)
def test_backward_strided_inputs(gen, v, dtype, shape):
    for name, (y, dy) in strided_backward_cases(shape, dtype, gen):
        assert not dy.is_contiguous(), name
        if not fits(v, (y, dy)):  # Triton step 1 past 32,768: refused, naming the steps that take it
            with pytest.raises(ValueError, match="steps"):
                v.backward(y, dy)
            continue
        try:
            assert_matches_reference(v, (y, dy), v.backward(y, dy), "backward")
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None


# ---- rows off 16 bytes: odd row lengths and storage offsets ---------------------------------------

# An odd 16-bit row length puts every row but the first off 16 bytes; a view k elements into a
# wider tensor moves the first row too, and leaves the (contiguous) output at another misalignment
# than the input. CUDA steps 5-6 read such rows as the 16-byte vectors of memory they overlap,
# element by element only in the first and last, and store through the same vectors only where
# the output shares the input's misalignment. The shapes: (9, 5) rows shorter than one vector;
# (6, 1001) step 5's warp tiles; (4, 12345) its 512-thread register tiles; (3, 16383) one vector
# past the register tiles once shifted (step 5's row in shared memory); (2, 20001) and (3, 50257)
# (the vocabulary row) step 5's row in shared memory (fp32 backward: too long, refused) and step
# 6's clusters. CUDA steps only: no Triton compile per new row length.
UNALIGNED_SHAPES = [(9, 5), (6, 1001), (4, 12345), (3, 16383), (2, 20001), (3, 50257)]
CUDA_STEPS = rosetta.variants("softmax", "cuda")


def at_offset(t: torch.Tensor, k: int) -> torch.Tensor:
    """t's values in a view k elements into each row of a NaN-filled tensor 8 elements wider: row
    pitches the same modulo 16 bytes as t's, every row k elements further on, and NaN just past
    both ends of each row (a read outside the row poisons it)."""
    rows, cols = t.shape
    wide = torch.full((rows, cols + 8), float("nan"), dtype=t.dtype, device=t.device)
    view = wide[:, k:k + cols]
    view.copy_(t)
    return view


@pytest.mark.parametrize("shape", UNALIGNED_SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("v", CUDA_STEPS, ids=lambda v: v.label)
def test_rows_off_16_bytes(gen, v, dtype, shape):
    """Forward: x contiguous, and k = 1, 3, 7 elements in (input and output misaligned apart).
    Backward: y and dy each 0-6 elements in (dx contiguous): all three alike, y apart, dy apart,
    dx apart, all apart. Into NaN-filled outputs: every element must be written."""
    x = make_inputs("softmax", shape, dtype, GPU, gen)[0]
    forward = [("contiguous", (x,))] + [(f"{k} in", (at_offset(x, k),)) for k in (1, 3, 7)]
    y, dy = make_inputs("softmax", shape, dtype, GPU, gen, "backward")
    backward = [(f"y {ky} in, dy {kg} in", (at_offset(y, ky), at_offset(dy, kg)))
                for ky, kg in ((0, 0), (1, 0), (0, 1), (1, 1), (3, 6))]
    ran = 0
    for direction, cases in (("forward", forward), ("backward", backward)):
        for name, inputs in cases:
            if not fits(v, inputs):  # steps 7-8 (unaligned rows), step 6 (short rows), step 5 (long)
                continue
            out = v.launch_into(*inputs, out=poisoned_output("softmax", inputs, direction), direction=direction)
            try:
                assert_matches_reference(v, inputs, out, direction)
            except AssertionError as e:
                raise AssertionError(f"{direction}, {name}: {e}") from None
            ran += 1
    if v.label.endswith(("05_row_on_chip", "06_cluster")) and shape[1] > 16384:
        assert ran, f"{v.label} took none of the cases"
