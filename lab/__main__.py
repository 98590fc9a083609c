"""``python -m lab demo`` / ``python -m lab cleanup``: see ``lab.demo`` and docs/demo.md."""

import sys

from lab.demo import main

sys.exit(main())
