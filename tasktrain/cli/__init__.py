"""tasktrain's command lines: `tasktrain launch | config | env | convert` (main.py) and TaskCLI, a training
script's config-file CLI (task_cli.py, imported on first use: it needs the `cli` extra)."""


def __getattr__(name):
    if name in ("TaskCLI", "SaveConfigCallback", "ReduceLROnPlateau", "cli_lightning_logo", "instantiate_class",
                "instantiate_module"):
        from tasktrain.cli import task_cli

        return getattr(task_cli, name)
    if name == "LightningArgumentParser":  # (made on first use: jsonargparse is the `cli` extra)
        from tasktrain.cli import task_cli

        return task_cli.argument_parser_class(task_cli._jsonargparse())
    raise AttributeError(f"module 'tasktrain.cli' has no attribute {name!r}")
