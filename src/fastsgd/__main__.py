import sys

from fastsgd.cli import main

sys.exit(main())
