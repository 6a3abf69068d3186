"""tasktrain's command lines: `tasktrain launch | config | env | convert` (main.py) and TaskCLI, a training
script's config-file CLI (task_cli.py, imported on first use: it needs the `cli` extra)."""


def __getattr__(name):
    if name in ("TaskCLI", "SaveConfigCallback", "ReduceLROnPlateau", "cli_lightning_logo"):
        from tasktrain.cli import task_cli

        return getattr(task_cli, name)
    raise AttributeError(f"module 'tasktrain.cli' has no attribute {name!r}")
