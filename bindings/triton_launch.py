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
            return self.kernel[grid](*args, **kwargs)
        key = self.key(args, kwargs)
        entry = self.cache.get(key) if key is not None else None
        if entry is None:
            return self.record(key, grid, args, kwargs)
        run, function, packed, fixed = entry
        full = list(args)
        names = self.names
        for i in range(len(args), len(names)):
            name = names[i]
            full.append(kwargs[name] if name in kwargs else fixed[name])
        if callable(grid):
            grid = grid(dict(zip(names, full)))
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1,
            _C._cuda_getCurrentRawStream(_C._cuda_getDevice()), function, packed, None, None, None, *full)

    def record(self, key, grid, args, kwargs):
        """Triton's own launch; then keep what it compiled and chose for this key."""
        from triton import knobs

        compiled = self.kernel[grid](*args, **kwargs)
        if key is None or compiled is None or _hooked(knobs.runtime.launch_enter_hook):
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
        self.cache[key] = (compiled.run, compiled.function, compiled.packed_metadata, fixed)
        return compiled


def _hooked(hook) -> bool:
    """Whether a launch hook is set: None or an empty HookChain (Triton 3.6's default) is not."""
    return hook is not None and bool(getattr(hook, "calls", True))


def install(module) -> None:
    """Give a Triton step module (and the shared modules it uses) this wrap_triton."""
    if getattr(module, "wrap_triton", None) is torch_wrap_triton:
        module.wrap_triton = wrap_triton
