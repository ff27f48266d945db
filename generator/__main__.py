"""Entry point for `python -m generator` (and `python -m ckfmha._generator`)."""

import sys

from .cli import main

sys.exit(main())
