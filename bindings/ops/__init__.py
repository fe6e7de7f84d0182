"""One OpSpec per op that has steps; the registry refuses step folders without one."""
from .reduce_sum import SPEC as _reduce_sum
from .vector_add import SPEC as _vector_add

SPECS = {spec.name: spec for spec in (_vector_add, _reduce_sum)}
