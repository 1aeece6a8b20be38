import sys

from lookahead.cli import main

sys.exit(main())
