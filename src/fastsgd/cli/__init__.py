"""The `fastsgd` command line: main.py parses and dispatches; scripts.py turns a user's script
into a Job. Nothing imports this package."""
