"""``python -m lab.kubeapi``: run the Kubernetes API emulator as a process."""

import sys

from lab.kubeapi.cli import main

sys.exit(main())
