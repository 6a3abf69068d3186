"""Lightning's loggers tasktrain does not have (LitLogger, which needs a lightning.ai account): importable under their
Lightning paths (`tasktrain.loggers`, `tasktrain.loggers.litlogger`), so a script's import and its isinstance checks
hold, and refused when created, before any training, with what to use instead."""
from tasktrain.loggers.logger import Logger


def absent_logger(name, service):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{name}: tasktrain has no {service} logger (Lightning's {name}). Use TensorBoardLogger, CSVLogger, "
            f"WandbLogger, MLFlowLogger or CometLogger, or give the Trainer a logger of your own that writes to "
            f"{service} (any object with Lightning's Logger methods; docs/logging.md, 'Writing a logger').")

    return type(name, (Logger,), {"__init__": __init__, "__module__": "tasktrain.loggers",
                                  "__doc__": f"Lightning's {name}: not in tasktrain, refused when created."})


LitLogger = absent_logger("LitLogger", "Lightning AI's LitLogger")
