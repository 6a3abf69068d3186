"""The `tasktrain` command line: launch, config, env (see main.py). Importing it stays light: no torch."""
