"""The eager Triton launch cache's key (rosetta.triton_launch): it must separate every launch that
Triton would compile or tune differently, and refuse what it cannot key; and a recorded plan's
workspaces laid out in one block. Runs on the CPU: neither needs a GPU (the launches and replays
themselves are tested in test_gpu.py)."""
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from rosetta.triton_launch import Launcher, Plan, Recording


def body(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr, EVEN: tl.constexpr = True):
    pass


KERNEL = Launcher(JITFunction(body))
HEAD = ("fn", "meta", None, None, None)  # what a fake launcher's run takes between the stream and the args


def key(*args, **kwargs):
    return KERNEL.key(args, kwargs)


def test_constexprs_are_keyed_by_value():
    x = torch.empty(64)
    assert key(x, x, 100, 7, 64) != key(x, x, 100, 7, 128)
    assert key(x, x, 100, 7, 64, EVEN=True) != key(x, x, 100, 7, 64, EVEN=False)


def test_ints_by_what_triton_specializes():
    x = torch.empty(64)
    assert key(x, x, 100, 7, 64) == key(x, x, 101, 9, 64)  # neither 1 nor a multiple of 16
    assert key(x, x, 32, 7, 64) != key(x, x, 33, 7, 64)  # divisible by 16 or not
    assert key(x, x, 1, 7, 64) != key(x, x, 3, 7, 64)  # 1 is its own case
    assert key(x, x, 2**31 + 3, 7, 64) != key(x, x, 3, 7, 64)  # 64-bit


def test_tensors_by_dtype_and_alignment():
    x = torch.empty(64)
    assert key(x, x, 3, 7, 64) != key(x, x.half(), 3, 7, 64)
    assert key(x, x, 3, 7, 64) != key(x, x[1:], 3, 7, 64)  # 4 bytes off a 16-byte boundary


def test_what_it_cannot_key_takes_tritons_path():
    x = torch.empty(64)
    assert key(x, (x, x), 3, 7, 64) is None


def test_autotuner_keys_by_its_exact_key_values():
    tuned = Launcher(triton.autotune(configs=[triton.Config({"BLOCK": 64})], key=["n"])(JITFunction(body)))
    x = torch.empty(64)
    assert tuned.key((x, x, 100, 7), {}) != tuned.key((x, x, 101, 7), {})


# ---- replay: a signature's launch() recorded once (CPU: fake launchers, CPU tensors) -------------

class FakeCuda:
    """The two CUDA queries a replay makes, answered without a GPU."""

    @staticmethod
    def _cuda_getCurrentRawStream(index):
        return 7

    @staticmethod
    def _cuda_getDevice():
        return 0


def recorded(raw, args, tensors):
    from rosetta import triton_launch

    return triton_launch.record(raw, args, tensors, torch.device("cpu"))


def test_replay_reallocates_rezeroes_and_relaunches_with_pointers(monkeypatch):
    from rosetta import triton_launch

    monkeypatch.setattr(triton_launch, "_C", FakeCuda)
    launched = []

    def run(gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args):
        launched.append(((gx, gy, gz), stream, function, args))

    def launch(x, out, eps):  # a step's launch(): a workspace, zeroed tickets, views, one kernel
        work = torch.empty(16)
        tickets = torch.zeros(4, dtype=torch.int32)
        triton_launch._recording.launch(run, HEAD, (3,), [x.view(-1)[2:], out, work, tickets, 5, eps, None])

    x, out = torch.arange(8.0).view(2, 4), torch.empty(8)
    plan = recorded(launch, (x, out, 0.5), 2)
    assert [a[0] for a in plan.actions] == ["launch"]  # the workspaces are the plan's blocks
    assert plan.sizes == [256, 256]  # 64 plain bytes, 16 zeroed ones, each block aligned
    launched.clear()
    x2, out2 = torch.zeros(2, 4), torch.empty(8)
    plan((x2, out2, 0.5))
    ((grid, stream, function, args),) = launched
    assert grid == (3, 1, 1) and stream == 7 and function == "fn"
    assert args[0] == x2.data_ptr() + 8 and args[1] == out2.data_ptr()  # an offset view of an input
    assert all(isinstance(p, int) and p for p in args[2:4]) and args[2] != args[3]  # its own workspace, tickets
    assert args[4:] == (5, 0.5, None)


def test_a_launch_that_does_more_is_not_recorded():
    from triton import knobs

    from rosetta import triton_launch

    def other_op(x, out):  # a torch op a plan would not redo
        out.copy_(x)

    def tritons_own_path(x, out):  # a launch the recorder did not see (a first compile, an unkeyed one)
        knobs.runtime.launch_enter_hook(None)

    def unknown_pointer(x, out):  # a tensor that is no input, output or workspace of this call
        triton_launch._recording.launch(print, HEAD, (1,), [STRAY])

    def plain(x, out):  # recordable on its own
        triton_launch._recording.launch(print, HEAD, (1,), [x, out])

    x, out = torch.ones(4), torch.empty(4)
    for launch in (other_op, tritons_own_path, unknown_pointer):
        assert recorded(launch, (x, out), 2) is None, launch.__name__
    assert recorded(plain, (x, out), 2) is not None
    packed = torch.ones(8)  # two inputs in one storage: which one a pointer came from is ambiguous
    assert recorded(plain, (packed[:4], packed[4:]), 2) is None
    assert recorded(plain, (x, x), 2) is None
    assert not triton_launch._hooked(knobs.runtime.launch_enter_hook)  # the recorder's hook is gone


STRAY = torch.ones(4)


def test_a_signature_is_recorded_once_then_replayed(monkeypatch):
    from rosetta import triton_launch

    monkeypatch.setattr(triton_launch, "_C", FakeCuda)
    launched, recorded_calls = [], []

    def run(gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args):
        launched.append(args)

    def launch(x, out, eps):  # a step's launch(): host work, then one kernel
        recorded_calls.append(eps)
        triton_launch._recording.launch(run, HEAD, (1,), [x, out, eps])

    replay = triton_launch.Replay(launch, torch.device("cuda", 0), 2)
    x, out = torch.ones(4), torch.empty(4)
    for _ in range(3):
        replay(x, out, 0.5)
    assert recorded_calls == [0.5]  # launch() ran once, under the recorder
    assert launched == [(x.data_ptr(), out.data_ptr(), 0.5)] * 2  # then the plan, twice
    replay(x, out, 0.25)  # another params value: a plan of its own
    assert recorded_calls == [0.5, 0.25]


def test_plan_lays_workspaces_out_in_one_block():
    """Two tensors of the call, then three workspaces: the ones zeroed before any kernel share a
    zeroed block, the others a plain one, each 256-byte aligned; a zero after a kernel stays an
    action of its own."""
    recording = Recording([torch.empty(4), torch.empty(4)])
    recording.actions = [("alloc", 60),  # base 2: plain
                         ("alloc", 28),  # base 3: zeroed
                         ("zero", 3),
                         ("alloc", 0),  # base 4: empty
                         ("launch", None, HEAD, (1, 1, 1), (), ()),
                         ("zero", 2)]
    plan = Plan(recording, torch.device("cpu"), 2)
    assert plan.where == [(0, 0, 60), (1, 0, 28), (0, 256, 0)]
    assert plan.sizes == [256, 256]
    assert [a[0] for a in plan.actions] == ["launch", "zero"]  # base 3's zero is the block's


def test_plan_of_empty_workspaces_allocates_nothing(monkeypatch):
    """A launch whose only workspace is empty replays with no block at all, its pointer null."""
    from rosetta import triton_launch

    monkeypatch.setattr(triton_launch, "_C", FakeCuda)
    launched = []

    def run(gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args):
        launched.append(args)

    def launch(x):
        work = torch.empty(0)
        triton_launch._recording.launch(run, HEAD, (1,), [x, work])

    plan = recorded(launch, (torch.ones(4),), 1)
    assert plan.sizes == [0, 0]
    launched.clear()
    x = torch.ones(4)
    plan((x,))
    assert launched == [(x.data_ptr(), 0)]


def test_tickets_one_zeroed_buffer_per_stream_asked_again_on_replay(monkeypatch):
    """triton_launch.tickets: made zeroed once per device and stream and kept (the kernel leaves it
    zero), grown when more are asked for; a recorded launch does not own it, and its replay asks
    for the buffer of the stream it replays on. While torch traces (wrap_triton's switch on), a
    fresh zeroed tensor."""
    from torch._library.triton import wrap_triton_enabled
    from torch._subclasses.fake_tensor import FakeTensorMode

    from rosetta import triton_launch

    monkeypatch.setattr(triton_launch, "_C", FakeCuda)
    monkeypatch.setattr(triton_launch, "_TICKETS", {})
    monkeypatch.setattr(wrap_triton_enabled, "value", True, raising=False)
    with FakeTensorMode():
        traced = triton_launch.tickets(torch.empty(4), 10)
    assert traced.numel() == 10 and not triton_launch._TICKETS
    monkeypatch.setattr(wrap_triton_enabled, "value", False)  # a plain launch, as torch_ops.raw_launcher makes it
    x = torch.ones(4)
    first = triton_launch.tickets(x, 10)
    assert first.dtype == torch.int32 and first.numel() >= 10 and not first.any()
    assert triton_launch.tickets(x, 10) is first
    monkeypatch.setattr(triton_launch, "_OUTGROWN", [])
    assert triton_launch.tickets(x, 2 * triton_launch.TICKETS_LEAST).numel() == 2 * triton_launch.TICKETS_LEAST
    assert triton_launch._OUTGROWN == [first]  # outgrown, kept: a captured graph may point into it

    launched = []

    def run(gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args):
        launched.append(args)

    def launch(x):
        triton_launch._recording.launch(run, HEAD, (1,), [x, triton_launch.tickets(x, 10)])

    plan = recorded(launch, (x,), 1)
    assert plan.where == [(None, 10, 0)] and plan.sizes == [0, 0]  # no block: not the call's memory
    launched.clear()
    plan((x,))
    assert launched == [(x.data_ptr(), triton_launch._TICKETS[(x.device, 7)].data_ptr())]  # stream 7's own


def test_replayed_plain_workspaces_use_the_streams_scratch(monkeypatch):
    """The plain block is the stream's kept scratch buffer: the same memory on every replay on one
    stream, another buffer on another stream; an outgrown buffer is kept (a captured graph may point
    into it), and a block past SCRATCH_MOST is allocated per call."""
    from rosetta import triton_launch

    monkeypatch.setattr(triton_launch, "_SCRATCH", {})
    monkeypatch.setattr(triton_launch, "_OUTGROWN", [])
    cpu = torch.device("cpu")
    first = triton_launch.scratch(cpu, 7, 300)
    assert first.dtype == torch.uint8 and first.numel() >= 300
    assert triton_launch.scratch(cpu, 7, 100) is first  # smaller: the same buffer
    assert triton_launch.scratch(cpu, 8, 100) is not first  # stream 8's own
    grown = triton_launch.scratch(cpu, 7, 1000)
    assert grown.numel() >= max(1000, 2 * first.numel())
    assert triton_launch._SCRATCH[(cpu, 7)] is grown and triton_launch._OUTGROWN == [first]  # the outgrown one kept
    huge = triton_launch.SCRATCH_MOST + 1
    assert triton_launch.scratch(cpu, 7, huge) is not triton_launch.scratch(cpu, 7, huge)
    assert triton_launch._SCRATCH[(cpu, 7)] is grown

    monkeypatch.setattr(triton_launch, "_C", FakeCuda)
    launched = []

    def run(gx, gy, gz, stream, function, packed, metadata, enter, exit_, *args):
        launched.append(args)

    def launch(x):
        triton_launch._recording.launch(run, HEAD, (1,), [x, torch.empty(64)])

    plan = recorded(launch, (torch.ones(4),), 1)
    launched.clear()
    plan((torch.ones(4),))
    plan((torch.ones(4),))
    assert launched[0][1] == launched[1][1] == triton_launch._SCRATCH[(cpu, 7)].data_ptr()


def test_c_launch_skips_tritons_python_wrapper_only_without_scratch():
    """c_launch: a launcher with no scratch buffers is called through its C function with the
    flags its wrapper would pass; one with scratch (or of another shape) through the wrapper."""
    from types import SimpleNamespace

    from rosetta.triton_launch import c_launch

    def launcher(scratch):
        return SimpleNamespace(launch="C", global_scratch_size=scratch, profile_scratch_size=0,
                               launch_cooperative_grid=False, launch_pdl=True)

    plain = SimpleNamespace(run=launcher(0), function="fn", packed_metadata="meta")
    assert c_launch(plain) == ("C", ("fn", False, True, None, None, "meta", None, None, None))
    scratchy = SimpleNamespace(run=launcher(64), function="fn", packed_metadata="meta")
    assert c_launch(scratchy) == (scratchy.run, ("fn", "meta", None, None, None))
    other = SimpleNamespace(run=print, function="fn", packed_metadata="meta")
    assert c_launch(other) == (print, HEAD)
