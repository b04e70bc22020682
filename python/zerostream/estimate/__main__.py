"""`python -m zerostream.estimate`: the same as `zerostream estimate`."""

import sys

from .cli import main

sys.exit(main())
