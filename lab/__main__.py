"""``python -m lab demo`` (the operator flow in the lab) / ``python -m lab cleanup``: see ``lab.demo``
and docs/demo.md."""

import sys

from lab.demo import main

sys.exit(main())
