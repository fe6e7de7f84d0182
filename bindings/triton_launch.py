"""Eager Triton launches at the cost of the compiled kernel's own launcher.

The steps launch their kernels as a reader would write it, `wrap_triton(kernel)[grid](*args)`.
Each such launch through `JITFunction.run` (and `Autotuner.run` around it) redoes, every time,
work whose answer a repeated call already knows: it binds the arguments to the parameters,
specializes each (dtype, 16-byte alignment, ints equal to 1 or divisible by 16, 32- or 64-bit),
builds a cache key (with `str()` of the options), reads the environment's knobs, looks the
compiled kernel up, and the autotuner rebuilds its key dict. Together that is several times the
launch itself.

`wrap_triton` here is a drop-in for torch's: while torch traces (or the registered op runs), it is
torch's own (given constexpr arguments as plain values); in an eager call it hands back a `Launcher`, which keys each launch by what Triton's
specialization can see (the constexprs' values, each tensor's dtype and alignment, each int's
specialization class, and the autotuner's key values) and, on a hit, calls the compiled kernel's
launcher directly with the grid evaluated here. A miss (the first launch of a kernel for a key) goes
through Triton's own path and records what it chose. Launches this cannot key (an argument of a
type it does not know, such as a TMA descriptor; a config with a pre-hook; a launch hook set, as a
profiler does) always take Triton's path. torch_ops loads the steps with this `wrap_triton` in
place of torch's, so the step files stay as a reader would write them.
"""
from __future__ import annotations

import inspect

import torch
from torch._library.triton import wrap_triton_enabled
from torch.library import wrap_triton as torch_wrap_triton
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

MAX_KEYS = 256  # recorded launches a kernel keeps; past this its cache starts again
_INT32 = (-(2**31), 2**31)
_C = torch._C  # _cuda_getDevice and _cuda_getCurrentRawStream: what Triton's driver asks, minus its Python


def wrap_triton(kernel):
    """torch.library.wrap_triton while torch's switch is on (tracing, the registered op); in an eager
    launch (the switch off) the kernel's cached Launcher."""
    if getattr(wrap_triton_enabled, "value", True):
        return Traced(torch_wrap_triton(kernel))
    launcher = _LAUNCHERS.get(id(kernel))  # by id: a JITFunction hashes through its cache_key property
    if launcher is None or launcher.kernel is not kernel:
        launcher = _LAUNCHERS[id(kernel)] = Launcher(kernel)
    return launcher


_LAUNCHERS: dict = {}


class Traced:
    """torch's traceable wrapper, handed plain values for tl.constexpr arguments: a constexpr object
    (a shared module's `GELU = tl.constexpr(1)`, passed as EPILOGUE=GELU) reaches the source that
    Inductor generates as `constexpr[1]`, which does not compile there; Triton takes the value."""

    def __init__(self, wrapped):
        self.wrapped = wrapped

    def __getitem__(self, grid):
        launch = self.wrapped[grid]
        return lambda *args, **kwargs: launch(*map(_plain, args), **{k: _plain(v) for k, v in kwargs.items()})


def _plain(value):
    import triton.language as tl

    return value.value if isinstance(value, tl.constexpr) else value


class Launcher:
    """kernel[grid](*args, **kwargs), the compiled kernel looked up once per specialization key."""

    def __init__(self, kernel):
        from triton.runtime.autotuner import Autotuner
        from triton.runtime.jit import JITFunction

        self.kernel = kernel
        self.tuner = kernel if isinstance(kernel, Autotuner) else None
        fn = kernel.fn if self.tuner is not None else kernel
        self.jit = fn if isinstance(fn, JITFunction) else None  # None: heuristics and the like, not keyed
        if self.jit is not None:
            self.names = [p.name for p in self.jit.params]
            self.constexpr = [p.is_constexpr for p in self.jit.params]
            self.defaults = {p.name: p.default for p in self.jit.params if p.default is not inspect.Parameter.empty}
            self.tuned_keys = tuple(self.names.index(k) for k in self.tuner.keys) if self.tuner else ()
        self.cache: dict = {}

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def key(self, args, kwargs):
        """What decides the compiled kernel (and the autotuner's pick), or None: not keyable."""
        key = []
        constexpr = self.constexpr
        for i, a in enumerate(args):
            t = type(a)
            if t is torch.Tensor or t is torch.nn.Parameter:
                key.append((a.dtype, a.data_ptr() % 16 == 0))
            elif i < len(constexpr) and constexpr[i]:
                key.append(a)
            elif t is int:
                key.append((a == 1, a % 16 == 0, _INT32[0] <= a < _INT32[1]))
            elif t is float or a is None or t is bool:
                key.append(t if t is float else a)
            else:
                return None  # a descriptor, a tuple, ...: Triton's own path
        for i in self.tuned_keys:  # the autotuner picks per exact key value
            key.append(args[i] if i < len(args) else kwargs.get(self.names[i]))
        if kwargs:
            key.append(tuple(kwargs.items()))  # constexprs and options by keyword: exact
        return tuple(key)

    def launch(self, grid, args, kwargs):
        if self.jit is None:
            if _recording is not None:  # a launch this module cannot keep
                _recording.ok = False
            return self.kernel[grid](*args, **kwargs)
        key = self.key(args, kwargs)
        entry = self.cache.get(key) if key is not None else None
        if entry is None:
            return self.record(key, grid, args, kwargs)
        run, head, fixed = entry
        full = list(args)
        names = self.names
        for i in range(len(args), len(names)):
            name = names[i]
            full.append(kwargs[name] if name in kwargs else fixed[name])
        if callable(grid):
            grid = grid(dict(zip(names, full)))
        if _recording is not None:
            _recording.launch(run, head, grid, full)
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            _C._cuda_getCurrentRawStream(_C._cuda_getDevice()), *head, *full)

    def record(self, key, grid, args, kwargs):
        """Triton's own launch; then keep what it compiled and chose for this key."""
        compiled = self.kernel[grid](*args, **kwargs)
        if key is None or compiled is None or _launch_hooked():
            return compiled
        fixed = dict(self.defaults)
        if self.tuner is not None:
            config = self.tuner.best_config
            if config.pre_hook is not None:
                return compiled
            fixed.update(config.kwargs)
        names = self.names
        if any(name not in kwargs and name not in fixed for name in names[len(args):]):
            return compiled  # a parameter this cannot fill on its own
        if hasattr(compiled, "result"):
            compiled = compiled.result()
        if len(self.cache) >= MAX_KEYS:
            self.cache.clear()
        self.cache[key] = (*c_launch(compiled), fixed)
        return compiled


def c_launch(compiled) -> tuple:
    """(run, head): a compiled kernel's launch as run(gridX, gridY, gridZ, stream, *head, *args).
    Triton's launcher object is a Python __call__ that makes scratch buffers (for kernels that
    declare any) and passes two flags through to the C function `launch` it wraps: about 1 us a
    launch on the H100's host. A kernel with no scratch is launched through that C function
    directly, given the same flags; any other (or a launcher of another shape) through the object."""
    run = compiled.run
    launch = getattr(run, "launch", None)
    no_scratch = getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0
    if launch is None or not no_scratch or not hasattr(run, "launch_pdl"):
        return run, (compiled.function, compiled.packed_metadata, None, None, None)
    return launch, (compiled.function, run.launch_cooperative_grid, run.launch_pdl, None, None,
                    compiled.packed_metadata, None, None, None)


def _hooked(hook) -> bool:
    """Whether a launch hook is set: None, an empty HookChain (Triton 3.6's default) or one holding
    only the recorder's own hook is not."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return calls is None or any(call is not _unkept for call in calls)


def install(module) -> None:
    """Give a Triton step module (and the shared modules it uses) this wrap_triton."""
    if getattr(module, "wrap_triton", None) is torch_wrap_triton:
        module.wrap_triton = wrap_triton


# ---- replay: a call signature's launches recorded once --------------------------------------------
# The public call fixes, per signature, every shape, stride, dtype and alignment a step's launch()
# sees, so everything that launch() computes on the host (tile choices, grids, workspace sizes,
# the autotuner's pick) comes out the same on every call of that signature. `Replay` runs launch()
# once under a recorder and keeps what it did: the workspaces it allocated (and zeroed), and per
# kernel the compiled launcher, the grid and the arguments, each tensor argument as a base tensor
# (an input, an output or a workspace) plus a byte offset. Later calls redo only that: allocate,
# then call each compiled launcher with raw pointers (an int pointer also skips the driver's
# per-tensor pointer query). A launch() that does anything else -- a torch op other than these
# allocations, views and zeroing, a kernel not yet compiled, an argument that cannot be keyed (a
# TMA descriptor), a launch hook -- is not recorded, and the signature keeps calling launch().

MAX_RECORD_TRIES = 3  # recordings a plan may take (the first call compiles and tunes: not kept)
_recording: "Recording | None" = None
_ALLOCATING = {"aten::empty.memory_format", "aten::empty_strided", "aten::new_empty", "aten::empty_like"}
_ALLOCATING_ZEROS = {"aten::zeros", "aten::new_zeros", "aten::zeros_like"}
_VIEWING = {"aten::view", "aten::_unsafe_view", "aten::alias", "aten::as_strided", "aten::unsqueeze",
            "aten::squeeze.dim", "aten::t", "aten::transpose.int", "aten::select.int", "aten::slice.Tensor",
            "aten::expand", "aten::permute", "aten::detach"}  # detach: torch adds it after a factory op


class Recording:
    """What one launch() call did, in order: ("alloc", bytes), ("tickets", count) (tickets()'s
    buffer: the replay asks again, for its own stream), ("zero", base) and ("launch", run, head,
    grid, args, pointers) (c_launch's run and head); `ok` turns False at anything else."""

    def __init__(self, tensors):
        self.bases = list(tensors)  # index i: the call's tensors, then each allocation in order
        self.actions: list = []
        # Tensors that share memory (x passed twice, q, k, v views of one packed tensor) make a
        # pointer's base ambiguous, and the signature does not say whether a later call shares
        # it the same way: such a call is not recorded.
        storages = [t.untyped_storage().data_ptr() for t in self.bases if t.numel()]
        self.ok = len(set(storages)) == len(storages)

    def base_of(self, t) -> tuple[int, int] | None:
        """(base index, byte offset) of a tensor argument: the latest base whose storage holds it."""
        ptr = t.data_ptr()
        for i in range(len(self.bases) - 1, -1, -1):
            storage = self.bases[i].untyped_storage()
            start = storage.data_ptr()
            if start <= ptr < start + max(storage.nbytes(), 1):
                return i, ptr - self.bases[i].data_ptr()
        return None

    def alloc(self, out) -> None:
        self.actions.append(("alloc", out.untyped_storage().nbytes()))
        self.bases.append(out)

    def tickets(self, buffer, count: int) -> None:
        self.actions.append(("tickets", count))
        self.bases.append(buffer)

    def zero(self, t) -> None:
        found = self.base_of(t)
        base = self.bases[found[0]] if found else None
        if base is None or found[1] != 0 or t.shape != base.shape or t.stride() != base.stride():
            self.ok = False  # only whole bases are zeroed on replay
            return
        self.actions.append(("zero", found[0]))

    def launch(self, run, head, grid, args) -> None:
        args, pointers = list(args), []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                if not a.data_ptr():  # an empty tensor: a null pointer, as Triton passes it
                    args[i] = 0
                    continue
                found = self.base_of(a)
                if found is None:
                    self.ok = False
                    return
                pointers.append((i, *found))
                args[i] = None
        grid = tuple(grid) + (1,) * (3 - len(grid))
        self.actions.append(("launch", run, head, grid, args, tuple(pointers)))


class _Watch(TorchDispatchMode):
    """The torch ops launch() runs while it is recorded: allocations, zeroing and views are kept
    or allowed; any other op makes the recording unusable."""

    def __init__(self, recording: Recording):
        super().__init__()
        self.recording = recording

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.name()
        if name in _ALLOCATING:
            self.recording.alloc(out)
        elif name in _ALLOCATING_ZEROS:
            self.recording.alloc(out)
            self.recording.zero(out)
        elif name == "aten::zero_":
            self.recording.zero(args[0])
        elif name not in _VIEWING:
            self.recording.ok = False
        return out


class Plan:
    """A recorded launch() of one signature, replayed on that signature's tensors. The workspaces
    it allocated come from one block of memory (two where some are zeroed: a torch.zeros for those
    zeroed before any kernel ran): an allocation from torch's caching allocator costs about as much
    host time as a launch, and matmul's split-K step made two a call even where nothing splits.
    The plain block is the stream's scratch (scratch()) when it fits there: no allocation at all."""

    ALIGN = 256  # bytes: each workspace starts where a fresh allocation would be aligned enough

    def __init__(self, recording: Recording, device: torch.device, tensors: int):
        self.device, self.tensors = device, tensors
        sizes, tickets, launched, zeroed = {}, {}, False, set()
        for action in recording.actions:  # bases past the call's tensors, in order: allocations and tickets
            if action[0] == "alloc":
                sizes[tensors + len(sizes) + len(tickets)] = action[1]
            elif action[0] == "tickets":
                tickets[tensors + len(sizes) + len(tickets)] = action[1]
            elif action[0] == "launch":
                launched = True
            elif not launched and action[1] in sizes:  # a zero before any kernel: the block comes zeroed
                zeroed.add(action[1])
        # per base past the tensors: (block, byte offset, bytes) of an allocation, or (None, count, 0)
        # for a tickets buffer; the blocks' bytes
        self.where, self.sizes = [], [0, 0]
        for base in range(tensors, tensors + len(sizes) + len(tickets)):
            if base in tickets:
                self.where.append((None, tickets[base], 0))
                continue
            size = sizes[base]
            block = int(base in zeroed)
            self.where.append((block, self.sizes[block], size))
            self.sizes[block] += -(-size // self.ALIGN) * self.ALIGN
        self.actions = [a for a in recording.actions
                        if a[0] == "launch" or (a[0] == "zero" and a[1] not in zeroed)]

    def __call__(self, args) -> None:
        plain, zeroed = self.sizes
        stream = _C._cuda_getCurrentRawStream(self.device.index)
        blocks = (scratch(self.device, stream, plain) if plain else None,
                  _zeros(zeroed, dtype=_BYTE, device=self.device) if zeroed else None)
        # each base's address: the call's tensors, then each allocation in its block
        address = [t.data_ptr() for t in args[:self.tensors]]
        address += [_ticket_buffer(self.device, stream, offset).data_ptr() if block is None
                    else blocks[block].data_ptr() + offset if size else 0 for block, offset, size in self.where]
        for action in self.actions:
            if action[0] == "launch":
                _, run, head, grid, kernel_args, pointers = action
                kernel_args = list(kernel_args)
                for i, base, offset in pointers:
                    kernel_args[i] = address[base] + offset
                run(grid[0], grid[1], grid[2], stream, *head, *kernel_args)
            elif action[1] < self.tensors:  # an output the launch zeroes
                args[action[1]].zero_()
            else:  # a workspace zeroed again after a kernel used it (an empty one has no block)
                block, offset, size = self.where[action[1] - self.tensors]
                if size:
                    blocks[block].narrow(0, offset, size).zero_()


_BYTE = torch.uint8
_empty, _zeros = torch.empty, torch.zeros


# ---- scratch: one kept buffer per stream for the replayed calls' plain workspaces -----------------
# A replayed call's plain workspaces (partial rows, split-K partials, placeholders) are written and
# read by that call's own kernels only, and launches on one stream run one after another: so every
# call replayed on a stream can use the same memory, allocated once. Larger blocks are allocated
# per call (their kernels take far longer than an allocation does). A buffer outgrown is kept, not
# freed: a CUDA graph captured while it was the stream's scratch still points into it. As with
# the tickets below, graphs captured on one stream must not be replayed at the same time on two.

SCRATCH_MOST = 16 << 20  # bytes: a stream's scratch buffer at most
_SCRATCH: dict = {}
_OUTGROWN: list = []  # scratch and ticket buffers a larger one replaced, kept


def scratch(device: torch.device, stream: int, nbytes: int) -> torch.Tensor:
    """At least nbytes of uint8 memory for one replayed call on `stream`: the stream's kept buffer
    (grown, to twice its size at least, when too small), or a fresh allocation past SCRATCH_MOST."""
    if nbytes > SCRATCH_MOST:
        return _empty(nbytes, dtype=_BYTE, device=device)
    buffer = _SCRATCH.get((device, stream))
    if buffer is not None and buffer.numel() >= nbytes:
        return buffer
    size = min(max(nbytes, 2 * buffer.numel() if buffer is not None else 0), SCRATCH_MOST)
    return _replace(_SCRATCH, (device, stream), _empty(size, dtype=_BYTE, device=device))


def _replace(buffers: dict, key, buffer: torch.Tensor) -> torch.Tensor:
    """buffers[key] = buffer, the one it replaces kept in _OUTGROWN (a CUDA graph captured while
    that was the stream's buffer still points into it)."""
    if key in buffers:
        _OUTGROWN.append(buffers[key])
    buffers[key] = buffer
    return buffer


# ---- tickets: counters that a kernel leaves at zero ------------------------------------------------
# A kernel whose programs meet behind a counter (the last of a tile's K-slices to arrive adds the
# others) needs the counters at zero when it starts. Zeroing them on every call is one more launch
# (a memset node in a graph), as long as the launch it replaces. So the kernel resets each counter
# itself once its last program has drawn it, and the buffer is zeroed once, when made. Launches on
# one stream run one after another, so one buffer per device and stream is never shared by two
# kernels at once. A CUDA graph keeps the buffer of the stream it was captured on: graphs captured
# on one stream must not be replayed at the same time on two streams (each would reset the other's
# counters).

TICKETS_LEAST = 4096  # counters a buffer holds at least (16 KB): one per output tile of a small GEMM
_TICKETS: dict = {}


def tickets(like: torch.Tensor, count: int) -> torch.Tensor:
    """`count` int32 counters at zero on `like`'s device, for a kernel that leaves each one it uses at
    zero again: in a plain launch (wrap_triton's switch off, as for the Launcher) the current
    stream's buffer; while torch traces or runs the registered op, a fresh torch.zeros, which a
    traced graph then holds, zeroed on every run."""
    if getattr(wrap_triton_enabled, "value", True):
        return torch.zeros(max(count, 1), dtype=torch.int32, device=like.device)
    device = like.device
    stream = _C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else 0
    if _recording is None:
        return _ticket_buffer(device, stream, count)
    with _disable_current_modes():  # made (once) outside the recorded call: not one of its allocations
        buffer = _ticket_buffer(device, stream, count)
    _recording.tickets(buffer, count)
    return buffer


def _ticket_buffer(device: torch.device, stream: int, count: int) -> torch.Tensor:
    buffer = _TICKETS.get((device, stream))
    if buffer is None or buffer.numel() < count:
        # a larger buffer replaces a smaller one, which is kept (and stays zero)
        buffer = _replace(_TICKETS, (device, stream),
                          torch.zeros(max(count, TICKETS_LEAST), dtype=torch.int32, device=device))
    return buffer


class Replay:
    """raw(*tensors, *params) for one call signature (tensors: the kernels' inputs then outputs),
    recorded on one of its first calls with those params, replayed after. Params (eps, a seed)
    are not in the signature: a plan is kept per params value, for the first MAX_PLANS values
    (a new seed on every call is never worth a recording)."""

    MAX_PLANS = 4

    def __init__(self, raw, device: torch.device, tensors: int):
        self.raw, self.device, self.tensors = raw, device, tensors
        self.plans: dict = {}
        self.tries = 0

    def __call__(self, *args) -> None:
        params = args[self.tensors:]
        plan = self.plans.get(params)
        if plan is not None and _C._cuda_getDevice() == self.device.index and not _launch_hooked():
            return plan(args)
        if self.tries >= MAX_RECORD_TRIES * self.MAX_PLANS or _recording is not None:
            return self.raw(*args)
        self.tries += 1
        plan = record(self.raw, args, self.tensors, self.device)
        if plan is not None:
            self.plans[params] = plan


def record(raw, args, tensors: int, device: torch.device) -> Plan | None:
    """Run raw(*args) once, recorded (args: `tensors` tensors, then the params): its Plan, or None
    when it did something a Plan cannot redo."""
    global _recording
    if _launch_hooked():  # a profiler's hook must see every launch: nothing is recorded
        raw(*args)
        return None
    recording = _recording = Recording(args[:tensors])
    hooks = _runtime().launch_enter_hook
    hooks.add(_unkept)
    try:
        with _Watch(recording):
            raw(*args)
    finally:
        _recording = None
        hooks.remove(_unkept)
    return Plan(recording, device, tensors) if recording.ok else None


def _unkept(*args, **kwargs) -> None:
    """The launch hook while a call is recorded: a kernel launched through Triton's own path (its
    first compile and tuning, an argument the Launcher cannot key, a kernel not launched through
    wrap_triton) is not in the recording, so the recording is not used."""
    if _recording is not None:
        _recording.ok = False


def _launch_hooked() -> bool:
    return _hooked(_runtime().launch_enter_hook)


_RUNTIME = None


def _runtime():
    """triton.knobs.runtime, imported on first use (rosetta is imported before TRITON_INTERPRET
    may be set) and not again on every replayed call."""
    global _RUNTIME
    if _RUNTIME is None:
        from triton import knobs

        _RUNTIME = knobs.runtime
    return _RUNTIME
