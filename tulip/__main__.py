"""`python -m tulip serve ...` is the same as the `tulip` console script."""

import sys

from tulip.cli import main

sys.exit(main())
