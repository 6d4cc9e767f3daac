"""`python -m gpupool` is the `gpupool` command."""

import sys

from .cli.main import main

sys.exit(main())
