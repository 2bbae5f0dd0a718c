"""Command-line subcommands, one module each (see cli.py)."""
