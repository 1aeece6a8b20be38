"""The ``lookahead`` subcommands, one module each; ``common`` holds the options they share."""
