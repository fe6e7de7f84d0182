"""The eager Triton launch cache's key (rosetta.triton_launch): it must separate every launch that
Triton would compile or tune differently, and refuse what it cannot key. Runs on the CPU: the key
needs no GPU (the launches themselves are tested in test_gpu.py)."""
import torch
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from rosetta.triton_launch import Launcher


def body(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr, EVEN: tl.constexpr = True):
    pass


KERNEL = Launcher(JITFunction(body))


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
        triton_launch._recording.launch(run, "fn", "meta", (3,), [x.view(-1)[2:], out, work, tickets, 5, eps, None])

    x, out = torch.arange(8.0).view(2, 4), torch.empty(8)
    plan = recorded(launch, (x, out, 0.5), 2)
    assert [a[0] for a in plan.actions] == ["alloc", "alloc", "zero", "launch"]
    launched.clear()
    x2, out2 = torch.zeros(2, 4), torch.empty(8)
    plan((x2, out2, 0.5))
    ((grid, stream, function, args),) = launched
    assert grid == (3, 1, 1) and stream == 7 and function == "fn"
    assert args[0] == x2.data_ptr() + 8 and args[1] == out2.data_ptr()  # an offset view of an input
    assert all(isinstance(p, int) and p for p in args[2:4])  # the replay's own workspace and tickets
    assert args[4:] == (5, 0.5, None)


def test_a_launch_that_does_more_is_not_recorded():
    from triton import knobs

    from rosetta import triton_launch

    def other_op(x, out):  # a torch op a plan would not redo
        out.copy_(x)

    def tritons_own_path(x, out):  # a launch the recorder did not see (a first compile, an unkeyed one)
        knobs.runtime.launch_enter_hook(None)

    def unknown_pointer(x, out):  # a tensor that is no input, output or workspace of this call
        triton_launch._recording.launch(print, "fn", "meta", (1,), [STRAY])

    def plain(x, out):  # recordable on its own
        triton_launch._recording.launch(print, "fn", "meta", (1,), [x, out])

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
        triton_launch._recording.launch(run, "fn", "meta", (1,), [x, out, eps])

    replay = triton_launch.Replay(launch, torch.device("cuda", 0), 2)
    x, out = torch.ones(4), torch.empty(4)
    for _ in range(3):
        replay(x, out, 0.5)
    assert recorded_calls == [0.5]  # launch() ran once, under the recorder
    assert launched == [(x.data_ptr(), out.data_ptr(), 0.5)] * 2  # then the plan, twice
    replay(x, out, 0.25)  # another params value: a plan of its own
    assert recorded_calls == [0.5, 0.25]
