"""TaskCLI: a training script's command line and config files from the classes' own signatures (LightningCLI's
way, on jsonargparse, which is the `cli` extra: pip install "tasktrain[cli]").

    # train.py
    from tasktrain.cli import TaskCLI
    TaskCLI(MyModule, MyDataModule)

    python train.py fit --config cfg.yaml --trainer.max_epochs 3 --model.lr 0.01
    python train.py fit --print_config > cfg.yaml        # every argument with its value, as YAML
    python train.py test --config cfg.yaml --ckpt_path best.ckpt

- Subcommands fit, validate, test and predict call the Trainer's method of that name; each takes `--config`
  (YAML, several allowed, later ones win, command-line arguments over all), `--print_config`, the groups
  `--trainer.*` (the Trainer's arguments), `--model.*` (model_class's __init__), `--data.*` (datamodule_class's,
  when given), the method's own arguments (`--ckpt_path`, ...) and `--seed_everything`.
- Objects are given as `class_path` / `init_args`: `--trainer.callbacks+=EarlyStopping --trainer.callbacks.monitor
  val_loss`, or in YAML. `subclass_mode_model=True` takes the model class itself from the config that way.
- `--seed_everything`: true (the default, `seed_everything_default`) draws a seed and writes it into the config,
  so that the saved config repeats the run; an int seeds with it; false does not seed. (Processes started by a
  launcher each draw their own: give an int for a multi-process run that repeats exactly.)
- fit writes the config it ran with to `<trainer.log_dir>/config.yaml` (SaveConfigCallback, rank 0); an existing
  one is an error unless `save_config_kwargs={"overwrite": True}`.
- `--optimizer` / `--lr_scheduler` (`auto_configure_optimizers=True`): any torch optimizer and scheduler, e.g.
  `--optimizer Adam --optimizer.lr 0.01 --lr_scheduler StepLR --lr_scheduler.step_size 10`. Given, they replace
  the module's configure_optimizers (a warning says so when the module defines one); ReduceLROnPlateau is this
  module's subclass with `monitor`. A scheduler without an optimizer is an error.
- `run=False`: no subcommand; the arguments are parsed and the objects built (`cli.trainer`, `cli.model`,
  `cli.datamodule`, `cli.config`) for the script to use. `args` may be a list of words or a dict of the config.
- Subclass hooks: `add_arguments_to_parser(parser)` (e.g. `parser.link_arguments("data.num_classes",
  "model.num_classes", apply_on="instantiate")`), `before_instantiate_classes()`, `before_<subcommand>()`,
  `after_<subcommand>()`.

Not here (LightningCLI has them): several optimizers through add_optimizer_args' link_to, and
environment-variable parsing.
"""
import functools
import importlib
import os
import random
import warnings

import torch

from tasktrain.callbacks.base import Callback

SUBCOMMANDS = {
    "fit": "Train the model (Trainer.fit).",
    "validate": "Run one evaluation over the validation data (Trainer.validate).",
    "test": "Run one evaluation over the test data (Trainer.test).",
    "predict": "Run inference over the prediction data (Trainer.predict).",
}
_DATA_ARGS = {"model", "module", "train_dataloaders", "val_dataloaders", "dataloaders", "datamodule"}


def _jsonargparse():
    try:
        import jsonargparse
    except ImportError as err:
        raise ImportError("TaskCLI needs jsonargparse, which tasktrain installs as its `cli` extra: "
                          'pip install "tasktrain[cli]" (or pip install jsonargparse).') from err
    return jsonargparse


class SaveConfigCallback(Callback):
    """Writes the config the run was started with to `<log_dir>/<config_filename>` when fit starts (rank 0)."""

    def __init__(self, parser, config, config_filename="config.yaml", overwrite=False, multifile=False):
        self.parser, self.config = parser, config
        self.config_filename, self.overwrite, self.multifile = config_filename, overwrite, multifile
        self.already_saved = False

    def setup(self, trainer, module, stage):
        if self.already_saved or stage != "fit":
            return
        path = os.path.join(trainer.log_dir, self.config_filename)
        exists = trainer.strategy.broadcast(os.path.isfile(path))
        if exists and not self.overwrite:
            raise RuntimeError(f"SaveConfigCallback: {path} already exists, and saving the config there would "
                               "replace the record of an earlier run. Use another default_root_dir or logger version, "
                               "or TaskCLI(save_config_kwargs={'overwrite': True}).")
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            self.parser.save(self.config, path, skip_none=False, overwrite=self.overwrite, multifile=self.multifile)
        self.already_saved = True


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau with the metric it watches (`monitor`), for `--lr_scheduler` in a config."""

    def __init__(self, optimizer, monitor, mode="min", factor=0.1, patience=10, threshold=1e-4,
                 threshold_mode="rel", cooldown=0, min_lr=0.0, eps=1e-8):
        super().__init__(optimizer, mode=mode, factor=factor, patience=patience, threshold=threshold,
                         threshold_mode=threshold_mode, cooldown=cooldown, min_lr=min_lr, eps=eps)
        self.monitor = monitor


def _build(init, *args):
    """The object a {class_path, init_args} config names, built with `args` first."""
    module_name, _, name = init["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), name)
    return cls(*args, **dict(init.get("init_args") or {}))


def _configured_optimizers(module, optimizer_init, scheduler_init):
    """configure_optimizers from the --optimizer and --lr_scheduler configs."""
    optimizer = _build(optimizer_init, module.parameters())
    if scheduler_init is None:
        return optimizer
    scheduler = _build(scheduler_init, optimizer)
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        monitor = getattr(scheduler, "monitor", None)
        if monitor is None:
            raise ValueError("--lr_scheduler torch.optim.lr_scheduler.ReduceLROnPlateau does not say which metric it "
                             "watches: use tasktrain.cli.ReduceLROnPlateau with --lr_scheduler.monitor val_loss.")
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "monitor": monitor}}
    return {"optimizer": optimizer, "lr_scheduler": scheduler}


class TaskCLI:
    def __init__(self, model_class=None, datamodule_class=None, save_config_callback=SaveConfigCallback,
                 save_config_kwargs=None, trainer_class=None, trainer_defaults=None, seed_everything_default=True,
                 parser_kwargs=None, subclass_mode_model=False, subclass_mode_data=False, args=None, run=True,
                 auto_configure_optimizers=True):
        jsonargparse = _jsonargparse()
        if trainer_class is None:
            from tasktrain.trainer.trainer import Trainer as trainer_class
        from tasktrain.trainer.module import TaskModule

        if model_class is None and not subclass_mode_model:
            model_class, subclass_mode_model = TaskModule, True  # the model comes from the config's class_path
        self.model_class, self.datamodule_class = model_class, datamodule_class
        self.trainer_class = trainer_class
        self.trainer_defaults = dict(trainer_defaults or {})
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = dict(save_config_kwargs or {})
        self.seed_everything_default = seed_everything_default
        self.subclass_mode_model, self.subclass_mode_data = subclass_mode_model, subclass_mode_data
        self.auto_configure_optimizers = auto_configure_optimizers
        self._jsonargparse = jsonargparse

        parser_kwargs = dict(parser_kwargs or {})
        if run:
            self.parser = self._main_parser(parser_kwargs)
            subcommands = self.parser.add_subcommands(required=True, dest="subcommand")
            self._subparsers = {}
            for name, description in SUBCOMMANDS.items():
                sub = self._subparsers[name] = self._parser(parser_kwargs.get(name, {}), description)
                self._add_method_arguments(sub, name)
                subcommands.add_subcommand(name, sub, help=description)
        else:
            self.parser = self._parser(parser_kwargs)
        # args: the command-line words (None: sys.argv[1:]), or a dict of the config itself (as LightningCLI takes)
        self.config = self.parser.parse_object(args) if isinstance(args, dict) else self.parser.parse_args(args)
        self.subcommand = self.config.get("subcommand") if run else None
        self._seed()
        self.before_instantiate_classes()
        self.config_init = self.parser.instantiate(self.config)
        here = self.config_init[self.subcommand] if self.subcommand else self.config_init
        self.datamodule = here.get("data") if datamodule_class is not None else None
        self.model = here.get("model")
        if self.auto_configure_optimizers:
            self._add_configure_optimizers(here.get("optimizer"), here.get("lr_scheduler"))
        self.trainer = self.instantiate_trainer(here)
        if self.subcommand:
            self._run_subcommand(self.subcommand)

    # -- parsers --------------------------------------------------------------------------------------------------
    def _main_parser(self, parser_kwargs):
        kwargs = {k: v for k, v in parser_kwargs.items() if k not in SUBCOMMANDS}
        kwargs.setdefault("description", "Train and evaluate with tasktrain; each subcommand has --help.")
        return self._jsonargparse.ArgumentParser(**kwargs)

    def _parser(self, kwargs, description=None):
        ArgumentParser, ActionConfigFile = self._jsonargparse.ArgumentParser, self._jsonargparse.ActionConfigFile
        kwargs = {k: v for k, v in kwargs.items() if k not in SUBCOMMANDS}
        if description:
            kwargs.setdefault("description", description)
        parser = ArgumentParser(**kwargs)
        parser.add_argument("-c", "--config", action=ActionConfigFile,
                            help="A YAML config file (several allowed; later ones and command-line arguments win).")
        parser.add_argument("--seed_everything", type=bool | int, default=self.seed_everything_default,
                            help="true: draw a seed (written into the config); an int: seed with it; false: no seed.")
        parser.add_class_arguments(self.trainer_class, "trainer", fail_untyped=False, instantiate=False,
                                   sub_configs=True)
        if self.trainer_defaults:
            parser.set_defaults({f"trainer.{k}": v for k, v in self.trainer_defaults.items()})
        if self.subclass_mode_model:
            parser.add_subclass_arguments(self.model_class, "model", required=True, fail_untyped=False)
        else:
            parser.add_class_arguments(self.model_class, "model", fail_untyped=False, sub_configs=True)
        if self.datamodule_class is not None:
            if self.subclass_mode_data:
                parser.add_subclass_arguments(self.datamodule_class, "data", required=True, fail_untyped=False)
            else:
                parser.add_class_arguments(self.datamodule_class, "data", fail_untyped=False, sub_configs=True)
        if self.auto_configure_optimizers:
            parser.add_subclass_arguments(torch.optim.Optimizer, "optimizer", skip={"params"}, instantiate=False,
                                          required=False, fail_untyped=False, default=None)
            parser.add_subclass_arguments((torch.optim.lr_scheduler.LRScheduler, ReduceLROnPlateau), "lr_scheduler",
                                          skip={"optimizer"}, instantiate=False, required=False, fail_untyped=False,
                                          default=None)
        self.add_arguments_to_parser(parser)
        return parser

    def _add_method_arguments(self, parser, subcommand):
        import inspect

        method = getattr(self.trainer_class, subcommand)
        skip = {name for name in inspect.signature(method).parameters if name in _DATA_ARGS}
        parser.add_method_arguments(self.trainer_class, subcommand, skip=skip, fail_untyped=False)

    # -- what a subclass overrides --------------------------------------------------------------------------------
    def add_arguments_to_parser(self, parser):
        """Add arguments or links to each subcommand's parser (called once per parser)."""

    def before_instantiate_classes(self):
        """Called after parsing, before the model, data and trainer are built."""

    def instantiate_trainer(self, config):
        kwargs = dict(vars(config["trainer"]))
        if self.subcommand == "fit" and self.save_config_callback is not None:
            # the subcommand's own config: `fit --config <saved file>` repeats the run
            saver = self.save_config_callback(self._subparsers["fit"], self.config["fit"], **self.save_config_kwargs)
            given = kwargs.get("callbacks")
            given = [] if given is None else [given] if isinstance(given, Callback) else list(given)
            kwargs["callbacks"] = given + [saver]
        return self.trainer_class(**kwargs)

    # -- running --------------------------------------------------------------------------------------------------
    def _seed(self):
        from tasktrain.trainer.seed import seed_everything

        config = self.config[self.subcommand] if self.subcommand else self.config
        seed = config.get("seed_everything")
        if seed is None or seed is False:
            return
        if seed is True:
            seed = random.randint(0, 2**31 - 1)
            config["seed_everything"] = seed  # the saved config repeats this run
        seed_everything(seed)

    def _add_configure_optimizers(self, optimizer_init, scheduler_init):
        if optimizer_init is None:
            if scheduler_init is not None:
                raise ValueError("--lr_scheduler was given without --optimizer: the scheduler would be built on an "
                                 "optimizer of the module's configure_optimizers that the CLI cannot see. Give "
                                 "--optimizer too, or build the scheduler in configure_optimizers.")
            return
        from tasktrain.trainer.module import TaskModule, is_overridden

        if is_overridden("configure_optimizers", self.model, TaskModule):
            warnings.warn(f"{type(self.model).__name__}.configure_optimizers is replaced by the --optimizer "
                          f"({optimizer_init['class_path']}) and --lr_scheduler given to {type(self).__name__}.")
        self.model.configure_optimizers = functools.partial(_configured_optimizers, self.model, optimizer_init,
                                                            scheduler_init)

    def _run_subcommand(self, subcommand):
        hook = getattr(self, f"before_{subcommand}", None)
        if callable(hook):
            hook()
        kwargs = {k: v for k, v in vars(self.config_init[subcommand]).items()
                  if k not in ("config", "seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler",
                               "__path__")}
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        getattr(self.trainer, subcommand)(self.model, **kwargs)
        hook = getattr(self, f"after_{subcommand}", None)
        if callable(hook):
            hook()
