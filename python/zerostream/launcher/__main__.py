"""`python -m zerostream.launcher ...`: what each node's command line runs."""

import sys

from .command import main

sys.exit(main())
