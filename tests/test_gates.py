"""The correctness gate (bench and tests) catches local damage that a normwise relative error
hides: planted errors on recorded-size inputs must fail it. CPU only: the reference answer is
computed by torch and then damaged by hand."""
import torch

from rosetta.ops import SPECS
from rosetta.ops.spec import as_tuple


def gen():
    return torch.Generator().manual_seed(7)


def test_vector_add_zeroed_tail_fails():
    """bf16 2^20+3 with the last 64 outputs zeroed: a normwise error of 7.1e-3 passed the old 8e-3
    bound; the exact comparison fails it."""
    d = SPECS["vector_add"].forward
    x, y = d.make_inputs((2**20 + 3,), torch.bfloat16, "cpu", gen())
    good = (x.float() + y.float()).to(torch.bfloat16)
    assert d.error(good, d.reference(x, y), (x, y)) <= d.tolerance[torch.bfloat16]
    bad = good.clone()
    bad[-64:] = 0
    assert d.error(bad, d.reference(x, y), (x, y)) > d.tolerance[torch.bfloat16]


def test_reduce_sum_skipped_block_fails_on_positive_data():
    """Skipping 0.1% of the input hides inside 1e-5 * sum|x| on randn data; the gate's second,
    all-positive data set exposes it."""
    d = SPECS["reduce_sum"].forward
    n, skipped = 2**22, slice(0, 2**22 // 1000)
    (x,) = d.make_inputs((n,), torch.float32, "cpu", gen())
    wrong = x.double().sum() - x[skipped].double().sum()
    hidden = d.error(wrong.float(), d.reference(x), (x,))
    (p,) = d.gate_inputs((n,), torch.float32, "cpu", gen())
    exposed = d.error((p.double().sum() - p[skipped].double().sum()).float(), d.reference(p), (p,))
    assert exposed > d.tolerance[torch.float32] * 10
    assert hidden < exposed  # why the gate needs the positive data set at all


def test_softmax_one_wrong_row_fails():
    d = SPECS["softmax"].forward
    (x,) = d.make_inputs((512, 1000), torch.float32, "cpu", gen())
    out = torch.softmax(x, -1)
    assert d.error(out, d.reference(x), (x,)) <= d.tolerance[torch.float32]
    out[77] = 1.0 / 1000  # a uniform row where a peaked one belongs: normwise tiny, locally wrong
    assert d.error(out, d.reference(x), (x,)) > d.tolerance[torch.float32]


def test_softmax_backward_zeroed_block_fails():
    d = SPECS["softmax"].backward
    y, dy = d.make_inputs((64, 4097), torch.float32, "cpu", gen())
    dx = d.reference(y, dy).float()
    assert d.error(dx, d.reference(y, dy), (y, dy)) <= d.tolerance[torch.float32]
    dx[:, 4096:] = 0  # the ragged last column never written
    assert d.error(dx, d.reference(y, dy), (y, dy)) > d.tolerance[torch.float32]


def test_matmul_skipped_tile_fails():
    d = SPECS["matmul"].forward
    a, b = d.make_inputs((300, 200, 300), torch.float32, "cpu", gen())
    out = (a.double() @ b.double()).float()
    assert d.error(out, d.reference(a, b), (a, b)) <= d.tolerance[torch.float32]
    out[256:, 256:] = 0  # the last partial tile skipped
    assert d.error(out, d.reference(a, b), (a, b)) > d.tolerance[torch.float32]


def test_tf32_would_fail_the_fp32_gate():
    """fp32 means fp32: inputs rounded to TF32's 10-bit mantissa miss the bound by orders."""
    d = SPECS["matmul"].forward
    a, b = d.make_inputs((64, 512, 64), torch.float32, "cpu", gen())
    tf32 = lambda t: (t.view(torch.int32) & ~0x1FFF).view(torch.float32)  # noqa: E731
    out = (tf32(a).double() @ tf32(b).double()).float()
    assert d.error(out, d.reference(a, b), (a, b)) > d.tolerance[torch.float32]


def test_nan_and_unwritten_outputs_never_pass():
    """Every output of every direction: NaN where the reference is finite fails, each output on
    its own (a kernel that writes y but forgets rstd fails too)."""
    for op, spec in SPECS.items():
        for direction, d in spec.directions().items():
            inputs = d.make_inputs(spec.cpu_shapes[2], torch.float32, "cpu", gen())
            ref = as_tuple(d.reference(*inputs))
            for k in range(len(d.outputs)):
                out = tuple(r.float() for r in ref)
                out[k].fill_(float("nan"))
                if out[k].numel():
                    assert d.error(out if len(out) > 1 else out[0], d.reference(*inputs), inputs) == float("inf"), \
                        (op, direction, d.outputs[k])


def test_softmax_error_in_blocks_of_rows_is_the_whole_tensor_error(monkeypatch):
    """The gate measures softmax a block of rows at a time (small fp64 temporaries): the same
    worst error, at the same flat index, as one pass over the whole tensor, NaN rows included."""
    import dataclasses

    from rosetta.ops import spec

    monkeypatch.setattr(spec, "ERROR_BLOCK_ELEMENTS", 3 * 1000)  # blocks of 3 rows of 1,000
    for direction in ("forward", "backward"):
        d = SPECS["softmax"].directions()[direction]
        whole = dataclasses.replace(d, row_inputs=None)
        for shape, at in (((10, 1000), (7, 999)), ((2, 5, 1000), (1, 3, 999))):  # 3-D: blocks of 1 x 5 rows
            inputs = d.make_inputs(shape, torch.float32, "cpu", gen())
            ref = d.reference(*inputs)
            out = ref.float()
            out[at] *= 1.01  # in a later block, its last row's last element
            assert d.error_report(out, ref, inputs) == whole.error_report(out, ref, inputs)
            flat = 0
            for index, size in zip(at, shape):
                flat = flat * size + index
            assert d.error_report(out, ref, inputs)[1] == flat
            out[0, 1] = float("nan")
            assert d.error(out, ref, inputs) == whole.error(out, ref, inputs) == float("inf")
