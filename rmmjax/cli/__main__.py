"""`python -m rmmjax.cli`."""

import sys

from rmmjax.cli.main import main

sys.exit(main())
