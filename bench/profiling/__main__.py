"""python -m rosetta.bench.profiling: see nsight.py."""
import sys

from .nsight import main

sys.exit(main())
