import sys

from dpex.cli import main

sys.exit(main())
