"""``python -m lab demo`` (the operator flow in the lab) / ``python -m lab cleanup``: see ``lab.demo``
and docs/demo.md. ``python -m lab controlplane up|down``: a real control plane (lab.controlplane,
docs/controlplane.md)."""

import sys

if sys.argv[1:2] == ["controlplane"]:
    from lab.controlplane.cli import main as controlplane_main

    sys.exit(controlplane_main(sys.argv[2:]))

from lab.demo import main

sys.exit(main())
