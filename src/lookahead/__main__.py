import sys

from lookahead.cli.main import main

sys.exit(main())
