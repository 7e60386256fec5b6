"""The `fincheck` console command and its core subcommands (`fincheck models`); the stages' own
commands live in their folders."""
