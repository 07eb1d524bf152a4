"""`marconi` subcommands: each registers its arguments without importing what it runs."""
