"""python -m rosetta.bench.sanitize: see sanitizer.py."""
import sys

from .sanitizer import main

sys.exit(main())
