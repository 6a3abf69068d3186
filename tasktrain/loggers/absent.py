"""Lightning's loggers tasktrain does not have (CometLogger, LitLogger): importable under their Lightning paths
(`tasktrain.loggers`, `tasktrain.loggers.comet`, `tasktrain.loggers.litlogger`), so a script's import and its
isinstance checks hold, and refused when created, before any training, with what to use instead."""
from tasktrain.loggers.logger import Logger


def absent_logger(name, service):
    def __init__(self, *args, **kwargs):
        raise NotImplementedError(
            f"{name}: tasktrain has no {service} logger (Lightning's {name}). Use TensorBoardLogger, CSVLogger, "
            f"WandbLogger or MLFlowLogger, or give the Trainer a logger of your own that writes to {service} "
            "(any object with Lightning's Logger methods; docs/logging.md, 'Writing a logger').")

    return type(name, (Logger,), {"__init__": __init__, "__module__": "tasktrain.loggers",
                                  "__doc__": f"Lightning's {name}: not in tasktrain, refused when created."})


CometLogger = absent_logger("CometLogger", "Comet (comet_ml)")
LitLogger = absent_logger("LitLogger", "Lightning AI's LitLogger")
