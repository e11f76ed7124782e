import sys

from mrtpo.cli import main

sys.exit(main())
