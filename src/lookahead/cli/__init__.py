"""The ``lookahead`` command: ``main`` builds the parser, one module per subcommand."""
