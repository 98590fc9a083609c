import sys

from lab.demo import main

sys.exit(main())
