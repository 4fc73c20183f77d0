"""One module per CLI command: `run(args) -> exit code`. Arguments are declared in app/cli.py."""
