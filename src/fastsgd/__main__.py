import sys

from fastsgd.cli.main import main

sys.exit(main())
