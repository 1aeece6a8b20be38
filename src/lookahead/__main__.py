import sys

try:
    from lookahead.cli.main import main
except KeyboardInterrupt:  # Ctrl-C while torch and transformers import: no traceback
    print("\nlookahead: interrupted", file=sys.stderr)
    sys.exit(130)

sys.exit(main())
