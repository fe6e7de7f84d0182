"""No Python here: this file only makes the CUDA sources installable data of `rosetta` (a built
wheel ships them as rosetta/cuda_kernels/, which the registry and the JIT build read)."""
