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
  `--trainer.*` (the Trainer's arguments), `--model.*` (model_class's __init__), `--data.*` (datamodule_class's;
  without one, an optional group of any DataModule by class_path, `--data=pkg.MyData --data.batch_size=4`, as
  LightningCLI's: left out, the model's own loaders are used), the method's own arguments (`--ckpt_path`, ...) and
  `--seed_everything`. model_class and trainer_class may be functions that return the object.
- Objects are given as `class_path` / `init_args`: `--trainer.callbacks+=EarlyStopping --trainer.callbacks.monitor
  val_loss`, or in YAML. `subclass_mode_model=True` takes the model class itself from the config that way.
- `--seed_everything`: true (the default, `seed_everything_default`) seeds with the launcher's seed
  (TASKTRAIN_GLOBAL_SEED or PL_GLOBAL_SEED), else 0 with a warning, as Lightning's CLI; an int seeds with it; false
  does not seed. The seed used is written into the config, so the saved config repeats the run. Data loader
  workers are seeded too (`seed_everything(..., workers=True)`).
- each run writes the config it ran with to `<trainer.log_dir>/config.yaml` (SaveConfigCallback, rank 0, once per
  Trainer; not under fast_dev_run), as Lightning's; an existing one is an error unless
  `save_config_kwargs={"overwrite": True}` (so a `test` into the fit's folder needs another folder or logger version).
- `--optimizer` / `--lr_scheduler` (`auto_configure_optimizers=True`): any torch optimizer and scheduler, e.g.
  `--optimizer Adam --optimizer.lr 0.01 --lr_scheduler StepLR --lr_scheduler.step_size 10`. Given, they replace
  the module's configure_optimizers (a warning says so when the module defines one); ReduceLROnPlateau is this
  module's subclass with `monitor`. A scheduler without an optimizer is an error.
- `run=False`: no subcommand; the arguments are parsed and the objects built (`cli.trainer`, `cli.model`,
  `cli.datamodule`, `cli.config`) for the script to use. `args` may be a list of words, or a dict or jsonargparse
  Namespace of the config.
- A subclass overrides LightningCLI's methods, called at Lightning's points with Lightning's arguments (TaskCLI's
  docstring lists the order): `add_arguments_to_parser(parser)` (e.g. `parser.link_arguments("data.num_classes",
  "model.num_classes", apply_on="instantiate")`), `init_parser`, `setup_parser`, `add_default_arguments_to_parser`,
  `add_core_arguments_to_parser`, `link_optimizers_and_lr_schedulers`, `subcommands()`, `parse_arguments`,
  `before_instantiate_classes()`, `instantiate_classes()`, `instantiate_trainer(**kwargs)`,
  `after_instantiate_classes()`, `configure_optimizers(lightning_module, optimizer, lr_scheduler=None)`,
  `before_<subcommand>()`, a method named as the subcommand (run in place of the trainer's), `after_<subcommand>()`.

- The parser is LightningCLI's (TaskArgumentParser): besides jsonargparse's `link_arguments`, it has
  `add_lightning_class_args(cls, key)` (a callback class added this way is built and appended to the trainer's
  callbacks), `add_optimizer_args(cls, nested_key="optimizer", link_to="AUTOMATIC")` and
  `add_lr_scheduler_args(...)`: "AUTOMATIC" makes them the module's configure_optimizers (at most one of each),
  another `link_to` passes the {class_path, init_args} to that key (e.g. "model.optimizer_init") for the module
  to build itself, which is how several optimizers are configured.
- `cli_lightning_logo()` prints a banner, as Lightning's.

- `parser_kwargs={"default_env": True}` reads the arguments from PL_-prefixed environment variables too
  (PL_TRAINER__MAX_EPOCHS; PL_FIT__TRAINER__MAX_EPOCHS under `fit`); `parser_class=` a subclass of
  `tasktrain.cli.LightningArgumentParser`, as Lightning's.
- `load_from_checkpoint_support=True` (the default, Lightning's): the model and the DataModule are built with the
  config they were parsed from as their given hyper-parameters, so a save_hyperparameters() in their __init__ stores
  that (the class path as "_class_path", and "_instantiator": "tasktrain.cli.instantiate_module") and
  `TaskModule.load_from_checkpoint(path)` / `DataModule.load_from_checkpoint(path)` rebuild the class the command
  line named (`--model=pkg.SubModel`), nested objects included, through instantiate_module. A checkpoint may name
  only an allowed instantiator and an already imported subclass of the class loading it; nothing it names is
  imported. False: the hyper-parameters are what __init__ received, as before.
- A subcommand's `--ckpt_path` that is a file: the model hyper-parameters it holds are parsed into the config over
  the command line's (LightningCLI's), the class too where one was recorded, so `test --ckpt_path` builds the model
  the checkpoint was trained as (a class whose module is not imported yet: give it as --model).
"""
import contextlib
import copy
import functools
import importlib
import inspect
import os
import sys
import types
import warnings
from typing import TYPE_CHECKING, Literal, Union

import torch

from tasktrain.callbacks.base import Callback

if TYPE_CHECKING:  # an extra, imported when TaskCLI is used
    import jsonargparse

SUBCOMMANDS = {
    "fit": "Train the model (Trainer.fit).",
    "validate": "Run one evaluation over the validation data (Trainer.validate).",
    "test": "Run one evaluation over the test data (Trainer.test).",
    "predict": "Run inference over the prediction data (Trainer.predict).",
}


_LOGO = r"""
   _            _    _             _
  | |_ __ _ ___| | _| |_ _ __ __ _(_)_ __
  | __/ _` / __| |/ / __| '__/ _` | | '_ \
  | || (_| \__ \   <| |_| | | (_| | | | | |
   \__\__,_|___/_|\_\\__|_|  \__,_|_|_| |_|
"""


def cli_lightning_logo():
    """Print the banner (Lightning's cli_lightning_logo, with tasktrain's name)."""
    print()
    print(_LOGO)
    print()


def _class_path(cls):
    return f"{cls.__module__}.{cls.__name__}"


def _with_class_path(cls, init_args):
    """{class_path, init_args} of an optimizer or scheduler group added for one class (its config is the init
    args alone)."""
    if hasattr(init_args, "as_dict"):
        init_args = init_args.as_dict()
    return {"class_path": _class_path(cls), "init_args": dict(init_args or {})}


_PARSER_CLASS = []


def argument_parser_class(jsonargparse):
    """TaskArgumentParser: jsonargparse's ArgumentParser with LightningArgumentParser's methods (made on first use:
    jsonargparse is an optional extra)."""
    if _PARSER_CLASS:
        return _PARSER_CLASS[0]

    class TaskArgumentParser(jsonargparse.ArgumentParser):
        """Lightning's LightningArgumentParser (`tasktrain.cli.LightningArgumentParser`): `default_env=True` reads
        each argument from an environment variable too, named with `env_prefix` as Lightning's
        (PL_TRAINER__MAX_EPOCHS; with subcommands PL_FIT__TRAINER__MAX_EPOCHS)."""

        def __init__(self, *args, description: str = "Train and evaluate with tasktrain; each subcommand has --help.",
                     env_prefix: str = "PL", default_env: bool = False, **kwargs):
            super().__init__(*args, description=description, env_prefix=env_prefix, default_env=default_env,
                             **kwargs)
            self.callback_keys = []  # groups of callback classes: built and appended to the trainer's callbacks
            self._optimizers = {}  # nested key -> (class or tuple of classes, link_to)
            self._lr_schedulers = {}

        def add_lightning_class_args(self, lightning_class, nested_key, subclass_mode=False, required=True):
            """The arguments of a Trainer, TaskModule, DataModule or Callback class (or a function that returns
            one) under `nested_key`; a Callback's is built and added to the trainer's callbacks."""
            from tasktrain.trainer.datamodule import DataModule
            from tasktrain.trainer.module import TaskModule
            from tasktrain.trainer.trainer import Trainer

            if callable(lightning_class) and not isinstance(lightning_class, type):
                lightning_class = jsonargparse.class_from_function(lightning_class)
            if not (isinstance(lightning_class, type) and issubclass(lightning_class,
                                                                      (Trainer, TaskModule, DataModule, Callback))):
                raise ValueError(f"add_lightning_class_args({lightning_class!r}): give a subclass of Trainer, "
                                 "TaskModule, DataModule or Callback, or a function that returns one.")
            if issubclass(lightning_class, Callback):
                self.callback_keys.append(nested_key)
            if subclass_mode:
                return self.add_subclass_arguments(lightning_class, nested_key, fail_untyped=False, required=required)
            return self.add_class_arguments(lightning_class, nested_key, fail_untyped=False,
                                            instantiate=not issubclass(lightning_class, Trainer), sub_configs=True)

        def add_optimizer_args(self, optimizer_class=(torch.optim.Optimizer,), nested_key="optimizer",
                               link_to="AUTOMATIC"):
            """An optimizer's arguments under `nested_key` (a tuple of classes: any subclass, by class_path)."""
            self._add_optim_group(optimizer_class, torch.optim.Optimizer, nested_key, link_to, "params",
                                  self._optimizers)

        def add_lr_scheduler_args(self, lr_scheduler_class=(torch.optim.lr_scheduler.LRScheduler, ReduceLROnPlateau),
                                  nested_key="lr_scheduler", link_to="AUTOMATIC"):
            """A learning-rate scheduler's arguments under `nested_key` (a tuple of classes: any subclass)."""
            self._add_optim_group(lr_scheduler_class, (torch.optim.lr_scheduler.LRScheduler,
                                                       torch.optim.lr_scheduler.ReduceLROnPlateau),
                                  nested_key, link_to, "optimizer", self._lr_schedulers)

        def _add_optim_group(self, classes, base, nested_key, link_to, skip, register):
            for cls in classes if isinstance(classes, tuple) else (classes,):
                if not (isinstance(cls, type) and issubclass(cls, base)):
                    raise ValueError(f"{nested_key}: {cls!r} is not a subclass of {base}.")
            kwargs = {"instantiate": False, "fail_untyped": False, "skip": {skip}}
            if isinstance(classes, tuple):
                self.add_subclass_arguments(classes, nested_key, required=False, default=None, **kwargs)
            else:
                self.add_class_arguments(classes, nested_key, sub_configs=True, **kwargs)
            register[nested_key] = (classes, link_to)

    TaskArgumentParser.__qualname__ = TaskArgumentParser.__name__  # (made here, importable from tasktrain.cli)
    _PARSER_CLASS.append(TaskArgumentParser)
    return TaskArgumentParser


def __getattr__(name):
    # TaskArgumentParser is made on first use (jsonargparse is an extra); found here by name, so a parser (and the
    # SaveConfigCallback that holds one) pickles, as ddp_spawn sends the trainer's callbacks to its children
    if name == "TaskArgumentParser":
        return argument_parser_class(_jsonargparse())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _jsonargparse():
    try:
        import jsonargparse
    except ImportError as err:
        raise ImportError("TaskCLI needs jsonargparse, which tasktrain installs as its `cli` extra: "
                          'pip install "tasktrain[cli]" (or pip install jsonargparse).') from err
    return jsonargparse


# Lightning-named classes that tasktrain imports on first use. jsonargparse finds a class given by its short name
# (--trainer.strategy=FSDPStrategy, --trainer.callbacks+=TQDMProgressBar) among the subclasses already imported only,
# and Lightning imports all of its own: TaskCLI imports these before it parses.
_LOADED_ON_FIRST_USE = {"tasktrain.strategies": ("DeepSpeedStrategy", "FSDPStrategy", "ModelParallelStrategy"),
                        "tasktrain.callbacks": ("TQDMProgressBar", "RichProgressBar")}


def _load_classes_named_on_the_command_line():
    for module_name, names in _LOADED_ON_FIRST_USE.items():
        module = importlib.import_module(module_name)
        for name in names:
            getattr(module, name)


class SaveConfigCallback(Callback):
    """Writes the config the run was started with to `<log_dir>/<config_filename>` when a run of any stage first
    starts (rank 0), then calls `save_config(trainer, pl_module, stage)` on rank 0, which a subclass overrides to save
    it elsewhere too (Lightning's); `save_to_log_dir=False` (Lightning's) writes no file, for a subclass whose
    save_config does."""

    def __init__(
        self,
        parser: "jsonargparse.ArgumentParser",
        config: "jsonargparse.Namespace",
        config_filename: str = "config.yaml",
        overwrite: bool = False,
        multifile: bool = False,
        save_to_log_dir: bool = True,
    ):
        self.parser, self.config = parser, config
        self.config_filename, self.overwrite, self.multifile = config_filename, overwrite, multifile
        self.save_to_log_dir = save_to_log_dir
        self.already_saved = False
        from tasktrain.trainer.module import is_overridden

        if not save_to_log_dir and not is_overridden("save_config", self, SaveConfigCallback):
            raise ValueError(  # (Lightning's words)
                "`save_to_log_dir=False` only makes sense when subclassing SaveConfigCallback to implement "
                "`save_config` and it is desired to disable the standard behavior of saving to log_dir.")

    def setup(self, trainer, pl_module, stage):
        if self.already_saved:
            return
        if self.save_to_log_dir:
            path = os.path.join(trainer.log_dir or trainer.default_root_dir, self.config_filename)
            exists = trainer.strategy.broadcast(os.path.isfile(path))
            if exists and not self.overwrite:
                raise RuntimeError(  # (Lightning's words)
                    f"{type(self).__name__} expected {path} to NOT exist. Aborting to avoid overwriting results of a "
                    "previous run (the config it ran with). Use another default_root_dir or logger version, delete "
                    "the previous config file, set `TaskCLI(save_config_callback=None)` to disable config saving, or "
                    'set `TaskCLI(save_config_kwargs={"overwrite": True})` to overwrite the config file.')
            if trainer.is_global_zero:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                self.parser.save(self.config, path, skip_none=False, overwrite=self.overwrite,
                                 multifile=self.multifile)
        if trainer.is_global_zero:
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True

    def save_config(self, trainer, pl_module, stage):
        """Override to save the config somewhere besides the log directory (a logger's experiment, ...): called on
        rank 0 once the file is written (Lightning's hook)."""


class ReduceLROnPlateau(torch.optim.lr_scheduler.ReduceLROnPlateau):
    """torch's ReduceLROnPlateau with the metric it watches (`monitor`), for `--lr_scheduler` in a config."""

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        monitor: str,
        mode: Literal["min", "max"] = "min",
        factor: float = 0.1,
        patience: int = 10,
        threshold: float = 1e-4,
        threshold_mode: Literal["rel", "abs"] = "rel",
        cooldown: int = 0,
        min_lr: Union[list[float], float] = 0.0,
        eps: float = 1e-8,
    ):
        super().__init__(optimizer, mode=mode, factor=factor, patience=patience, threshold=threshold,
                         threshold_mode=threshold_mode, cooldown=cooldown, min_lr=min_lr, eps=eps)
        self.monitor = monitor


def instantiate_class(args, init):
    """The object a {class_path, init_args} config names, built with `args` first (one positional argument, or a
    tuple of them): Lightning's cli.instantiate_class."""
    kwargs = dict(init.get("init_args") or {})
    args = args if isinstance(args, tuple) else (args,)
    module_name, _, name = init["class_path"].rpartition(".")
    cls = getattr(importlib.import_module(module_name), name)
    return cls(*args, **kwargs)


class _RefuseImports:
    """A sys.meta_path finder that refuses to import the modules it is given (the dotted names a checkpoint's strings
    spell): a checkpoint must not make code run by naming it. `refused` lists what it refused."""

    def __init__(self, names):
        self.names, self.refused = names, []

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names:
            self.refused.append(fullname)
            raise ImportError(f"{fullname} is named by a checkpoint and is not imported already: not importing it.")
        return None  # (not ours: the other finders look)


def _dotted_names(value):
    """Every dotted prefix of every string in a config ("a.b.C" -> a, a.b, a.b.C): the modules it could name."""
    if isinstance(value, dict):
        return set().union(set(), *map(_dotted_names, value.values()))
    if isinstance(value, (list, tuple)):
        return set().union(set(), *map(_dotted_names, value))
    if isinstance(value, str):
        parts = value.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return set()


@contextlib.contextmanager
def _importing_nothing_named_in(config):
    """While open, no module that a string of `config` names (a checkpoint's hyper-parameters) is imported unless it
    already was; yields the finder, whose `refused` says what was asked for."""
    guard = _RefuseImports(_dotted_names(config) - set(sys.modules))
    sys.meta_path.insert(0, guard)
    try:
        yield guard
    finally:
        sys.meta_path.remove(guard)


def instantiate_module(class_type, config):
    """Lightning's cli.instantiate_module: the TaskModule or DataModule (of `class_type`) that a checkpoint's
    hyper-parameters describe as TaskCLI recorded them, built through a jsonargparse parser of class_type's arguments:
    "_class_path", where there, is the class (load_from_checkpoint has checked it is an imported subclass), the rest
    its init args; nested objects given as {class_path, init_args} are built too. While it parses and builds, no
    module that a string of the config names is imported: such a class must be imported already."""
    jsonargparse = _jsonargparse()
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    if "_class_path" in config:
        parser.add_subclass_arguments(class_type, "module", fail_untyped=False)
        config = {"class_path": config["_class_path"],
                  "dict_kwargs": {k: v for k, v in config.items() if k != "_class_path"}}
    else:
        parser.add_class_arguments(class_type, "module", fail_untyped=False)
    with _importing_nothing_named_in(config) as guard:
        try:
            built = parser.instantiate_classes(parser.parse_object({"module": config}))
        except Exception as err:
            if guard.refused:
                raise ValueError(f"{class_type.__name__}.load_from_checkpoint: the checkpoint's hyper-parameters name "
                                 f"{sorted(set(guard.refused))}, not imported, so nothing was imported or built (a "
                                 "checkpoint must not choose the code that runs). If you trust the file, import what "
                                 "it names before loading.") from err
            raise
    return built.module


def _module_type(value):
    """The class a model_class / datamodule_class stands for: itself, or what a function returning one returns."""
    if callable(value) and not isinstance(value, type):
        return inspect.signature(value).return_annotation
    return value


class TaskCLI:
    """LightningCLI's order of calls, each a method a subclass may override (Lightning's names and arguments):

        __init__ -> setup_parser(run, main_kwargs, subparser_kwargs)
                      -> init_parser(**kwargs) for the main parser and each subcommand's (subcommands() names them)
                      -> add_default_arguments_to_parser, add_core_arguments_to_parser, add_arguments_to_parser,
                         then the --optimizer / --lr_scheduler groups and link_optimizers_and_lr_schedulers(parser)
                 -> parse_arguments(parser, args)         (sets self.config; a --ckpt_path file's model
                                                           hyper-parameters are parsed over it)
                 -> seeding -> (load_from_checkpoint_support) -> before_instantiate_classes()
                 -> instantiate_classes()                  (config_init, datamodule, model, trainer)
                      -> instantiate_trainer(**kwargs)     (extra keywords over the config's trainer arguments)
                 -> after_instantiate_classes()
                 -> before_<subcommand>(), self.<subcommand> if the CLI defines one else trainer.<subcommand>,
                    after_<subcommand>()
    """

    def __init__(self, model_class=None, datamodule_class=None, save_config_callback=SaveConfigCallback,
                 save_config_kwargs=None, trainer_class=None, trainer_defaults=None, seed_everything_default=True,
                 parser_kwargs=None, parser_class=None, subclass_mode_model=False, subclass_mode_data=False,
                 args=None, run=True, auto_configure_optimizers=True, load_from_checkpoint_support=True):
        base_parser = argument_parser_class(self._jsonargparse)
        if parser_class is None:
            parser_class = base_parser
        elif not (isinstance(parser_class, type) and issubclass(parser_class, base_parser)):
            raise TypeError(f"{type(self).__name__}(parser_class={parser_class!r}): give a subclass of "
                            "tasktrain.cli.LightningArgumentParser (Lightning's parser, made with jsonargparse).")
        self.parser_class = parser_class
        _load_classes_named_on_the_command_line()
        if trainer_class is None:
            from tasktrain.trainer.trainer import Trainer as trainer_class
        from tasktrain.trainer.module import TaskModule

        if model_class is None and not subclass_mode_model:
            model_class, subclass_mode_model = TaskModule, True  # the model comes from the config's class_path
        self.model_class, self.datamodule_class = model_class, datamodule_class
        if datamodule_class is None:  # (Lightning's) an optional --data group of any DataModule, by class_path
            subclass_mode_data = True
        self.trainer_class = trainer_class
        self.trainer_defaults = dict(trainer_defaults or {})
        self.save_config_callback = save_config_callback
        self.save_config_kwargs = dict(save_config_kwargs or {})
        self.seed_everything_default = seed_everything_default
        self.subclass_mode_model, self.subclass_mode_data = subclass_mode_model, subclass_mode_data
        self.auto_configure_optimizers = auto_configure_optimizers
        self.parser_kwargs = dict(parser_kwargs or {})

        names = self.subcommands()
        main_kwargs = {k: v for k, v in self.parser_kwargs.items() if k not in names}
        subparser_kwargs = {k: v for k, v in self.parser_kwargs.items() if k in names}
        self.setup_parser(run, main_kwargs, subparser_kwargs)
        self.parse_arguments(self.parser, args)
        self._parse_ckpt_path()
        self.subcommand = self.config["subcommand"] if run else None
        self._set_seed()
        if load_from_checkpoint_support:
            self._add_instantiators()
        self.before_instantiate_classes()
        self.instantiate_classes()
        self.after_instantiate_classes()
        if self.subcommand is not None:
            self._run_subcommand(self.subcommand)

    @property
    def _jsonargparse(self):
        # (not kept as an attribute: the parsers' instantiators hold this CLI, and they pickle with a
        # SaveConfigCallback when strategy="ddp_spawn" sends the trainer to its children; a module does not pickle)
        return _jsonargparse()

    # -- parsers (Lightning's methods, in the order they are called) ----------------------------------------------
    def init_parser(self, **kwargs):
        """Make one parser (the main one, and one per subcommand) with its --config argument; a config it prints or
        saves begins with the comment `# tasktrain==<version>` (Lightning's `# lightning.pytorch==<version>`)."""
        from tasktrain.version import __version__

        kwargs.setdefault("dump_header", [f"tasktrain=={__version__}"])
        parser = self.parser_class(**kwargs)
        parser.add_argument("-c", "--config", action=self._jsonargparse.ActionConfigFile,
                            help="A YAML config file (several allowed; later ones and command-line arguments win).")
        return parser

    def setup_parser(self, add_subcommands, main_kwargs, subparser_kwargs):
        """Make self.parser: with add_subcommands (run=True) one subcommand parser per subcommands() entry under it,
        else the arguments on the main parser itself."""
        self.parser = self.init_parser(**main_kwargs)
        if add_subcommands:
            self._subcommand_method_arguments = {}
            self._add_subcommands(self.parser, **subparser_kwargs)
        else:
            self._add_arguments(self.parser)

    def add_default_arguments_to_parser(self, parser):
        """--seed_everything."""
        parser.add_argument("--seed_everything", type=bool | int, default=self.seed_everything_default,
                            help="true: draw a seed (written into the config); an int: seed with it; false: no seed.")

    def add_core_arguments_to_parser(self, parser):
        """The groups trainer (the trainer class's arguments, from trainer_defaults), model and data."""
        parser.add_lightning_class_args(self.trainer_class, "trainer")  # (a class, or a function returning one)
        # trainer_defaults' callbacks are not a default the command line replaces: they are appended to the
        # trainer's callbacks (instantiate_trainer), as Lightning's
        defaults = {f"trainer.{k}": v for k, v in self.trainer_defaults.items() if k != "callbacks"}
        if defaults:
            parser.set_defaults(defaults)
        parser.add_lightning_class_args(self.model_class, "model", subclass_mode=self.subclass_mode_model)
        if self.datamodule_class is not None:
            parser.add_lightning_class_args(self.datamodule_class, "data", subclass_mode=self.subclass_mode_data)
        else:
            # any DataModule by class_path, not required (Lightning's): without --data the model's own loaders are used
            from tasktrain.trainer.datamodule import DataModule

            parser.add_lightning_class_args(DataModule, "data", subclass_mode=True, required=False)

    def add_arguments_to_parser(self, parser):
        """Override to add arguments or links to each parser (called once per parser: each subcommand's, or the
        main one with run=False), after the default and core groups, before the optimizer groups."""

    def _add_arguments(self, parser):
        self.add_default_arguments_to_parser(parser)
        self.add_core_arguments_to_parser(parser)
        self.add_arguments_to_parser(parser)
        if self.auto_configure_optimizers:  # (Lightning's order: the subclass's own groups first)
            if not parser._optimizers:
                parser.add_optimizer_args((torch.optim.Optimizer,))
            if not parser._lr_schedulers:
                parser.add_lr_scheduler_args()
        self.link_optimizers_and_lr_schedulers(parser)

    @staticmethod
    def subcommands():
        """The subcommands, each a Trainer method, with the arguments of that method the CLI fills itself (not
        parsed)."""
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
            "predict": {"model", "dataloaders", "datamodule"},
        }

    def _add_subcommands(self, parser, **kwargs):
        self._subcommand_parsers = {}
        parser_subcommands = parser.add_subcommands(required=True, dest="subcommand")
        # a function that builds the trainer (Lightning's trainer_class may be one): the class it returns
        trainer_class = (self.trainer_class if isinstance(self.trainer_class, type)
                         else self._jsonargparse.class_from_function(self.trainer_class))
        for subcommand in self.subcommands():
            method = getattr(trainer_class, subcommand, None)
            if not callable(method):
                raise ValueError(f"{type(self).__name__}.subcommands() names {subcommand!r}, which is not a method of "
                                 f"{trainer_class.__name__}: each subcommand runs the trainer's method of its name.")
            description = SUBCOMMANDS.get(subcommand) or (inspect.getdoc(method) or "").split("\n")[0] or None
            subparser_kwargs = dict(kwargs.get(subcommand, {}))
            subparser_kwargs.setdefault("description", description)
            self._subcommand_parsers[subcommand] = self._prepare_subcommand_parser(trainer_class, subcommand,
                                                                                   **subparser_kwargs)
            parser_subcommands.add_subcommand(subcommand, self._subcommand_parsers[subcommand], help=description)

    def _prepare_subcommand_parser(self, klass, subcommand, **kwargs):
        parser = self.init_parser(**kwargs)
        self._add_arguments(parser)
        skip = set(self.subcommands()[subcommand])
        added = parser.add_method_arguments(klass, subcommand, skip=skip, fail_untyped=False)
        self._subcommand_method_arguments[subcommand] = added  # what is passed to the method
        return parser

    @staticmethod
    def link_optimizers_and_lr_schedulers(parser):
        """Link each optimizer / lr_scheduler group whose link_to is not "AUTOMATIC" to its key (a group of one class
        passes {class_path, init_args})."""
        for key, (classes, link_to) in {**parser._optimizers, **parser._lr_schedulers}.items():
            if link_to == "AUTOMATIC":
                continue
            if isinstance(classes, tuple):
                parser.link_arguments(key, link_to)
            else:
                parser.link_arguments(key, link_to, compute_fn=functools.partial(_with_class_path, classes))

    def parse_arguments(self, parser, args):
        """Parse `args` (None: sys.argv[1:]; a list of command-line words; a dict or Namespace of the config itself)
        into self.config."""
        if args is not None and len(sys.argv) > 1:  # (Lightning's warning, its words)
            warnings.warn("LightningCLI's args parameter is intended to run from within Python like if it were from "
                          "the command line. To prevent mistakes it is not recommended to provide both args and "
                          f"command line arguments, got: sys.argv[1:]={sys.argv[1:]}, args={args}.")
        if isinstance(args, (dict, self._jsonargparse.Namespace)):
            self.config = parser.parse_object(args)
        else:
            self.config = parser.parse_args(args)

    def _parse_ckpt_path(self):
        """A subcommand's --ckpt_path that is a file: the model hyper-parameters it holds are parsed into the config,
        over the command line's (LightningCLI's), so `test --ckpt_path` builds the model the checkpoint was trained
        as, its class too where a TaskCLI recorded it ("_class_path"). The saved config.yaml shows them. Nothing the
        checkpoint names is imported: a class in a module not imported yet is an error (give it as --model)."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not (isinstance(ckpt_path, str) and os.path.isfile(ckpt_path)):
            return
        from tasktrain.checkpoint_io import load_checkpoint_file

        hparams = dict(load_checkpoint_file(ckpt_path, map_location="cpu", mmap=True).get("hyper_parameters") or {})
        hparams.pop("_instantiator", None)
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        with _importing_nothing_named_in(hparams) as guard:
            try:
                self.config = self.parser.parse_object({subcommand: {"model": hparams}}, self.config)
            except SystemExit:
                sys.stderr.write("Parsing of ckpt_path hyperparameters failed!\n")  # (Lightning's words)
                if guard.refused:
                    sys.stderr.write(f"{ckpt_path} names {sorted(set(guard.refused))}, which is not imported, and a "
                                     "checkpoint's hyper-parameters import nothing: give the model's class on the "
                                     "command line (--model=...) to import it.\n")
                raise

    # -- building -------------------------------------------------------------------------------------------------
    def _add_instantiators(self):
        """load_from_checkpoint_support: the model and the DataModule are built with their part of the parsed config
        as given hyper-parameters, which save_hyperparameters() stores in place of __init__'s (LightningCLI's)."""
        from tasktrain.trainer.datamodule import DataModule

        self.parser.add_instantiator(functools.partial(self._instantiate_with_config, "model"),
                                     _module_type(self.model_class), subclasses=self.subclass_mode_model)
        self.parser.add_instantiator(functools.partial(self._instantiate_with_config, "data"),
                                     _module_type(self.datamodule_class or DataModule),
                                     subclasses=self.subclass_mode_data)

    def _instantiate_with_config(self, key, class_type, *args, applied_instantiation_links, **kwargs):
        """Build `class_type` (the config's `key`: model or data) while its config is the given hyper-parameters:
        its init args as parsed (nested objects as {class_path, init_args}, plain data a checkpoint keeps), the
        class path as "_class_path" in subclass mode, and the values instantiation links gave it."""
        from tasktrain.trainer.module import given_hyperparameters

        if not hasattr(self, "config_dump"):  # (once: the whole config as YAML data, link targets included)
            import yaml

            dump = yaml.safe_load(self.parser.dump(self.config, skip_link_targets=False, skip_none=False,
                                                   format="yaml"))
            self.config_dump = dump[self.config["subcommand"]] if "subcommand" in self.config else dump
        hparams = self.config_dump.get(key) or {}
        if "class_path" in hparams:  # the same keys in subclass mode as without, the class beside them
            hparams = {"_class_path": hparams["class_path"], **(hparams.get("init_args") or {}),
                       **(hparams.get("dict_kwargs") or {})}
        hparams = copy.deepcopy(hparams)
        for target, value in applied_instantiation_links.items():
            if not target.startswith(key + "."):
                continue
            names = target[len(key) + 1:].removeprefix("init_args.").split(".")
            place = hparams
            for name in names[:-1]:
                place = place.setdefault(name, {})
            place[names[-1]] = value
        with given_hyperparameters(hparams, "tasktrain.cli.instantiate_module"):
            return class_type(*args, **kwargs)

    def before_instantiate_classes(self):
        """Override to run code after parsing (self.config), before the model, data and trainer are built."""

    def instantiate_classes(self):
        """Build the classes of the config: self.config_init, self.datamodule, self.model (with the --optimizer /
        --lr_scheduler configure_optimizers) and self.trainer (instantiate_trainer)."""
        self.config_init = self.parser.instantiate_classes(self.config)
        self.datamodule = self._get(self.config_init, "data")
        self.model = self._get(self.config_init, "model")
        self._add_configure_optimizers_method_to_model(self.subcommand)
        self.trainer = self.instantiate_trainer()

    def after_instantiate_classes(self):
        """Override to run code once the classes are built, before the subcommand runs."""

    def instantiate_trainer(self, **kwargs):
        """Build the trainer from the config's trainer arguments, `kwargs` over them; the callbacks of
        add_lightning_class_args(SomeCallback, key) groups and the SaveConfigCallback are appended to its
        callbacks."""
        extra_callbacks = [self._get(self.config_init, key) for key in self._parser(self.subcommand).callback_keys]
        trainer_config = {**vars(self._get(self.config_init, "trainer", default=self._jsonargparse.Namespace())),
                          **kwargs}
        return self._instantiate_trainer(trainer_config, extra_callbacks)

    def _instantiate_trainer(self, config, callbacks):
        if "callbacks" not in config:  # a trainer class without a callbacks argument (Lightning's warning)
            warnings.warn(f"The `{self.trainer_class.__qualname__}` class does not expose the `callbacks` argument "
                          "so they will not be included.")
            return self.trainer_class(**config)
        given = config["callbacks"]
        config["callbacks"] = [] if given is None else [given] if isinstance(given, Callback) else list(given)
        config["callbacks"].extend(callbacks)
        if "callbacks" in self.trainer_defaults:  # appended to the command line's, as Lightning's
            value = self.trainer_defaults["callbacks"]
            config["callbacks"] += value if isinstance(value, list) else [value]
        if self.save_config_callback is not None and not config.get("fast_dev_run"):
            # every subcommand's (Lightning's), its own config: `fit --config <saved file>` repeats the run; with
            # run=False the whole config (no subcommand); none under fast_dev_run, as Lightning's
            config["callbacks"].append(self.save_config_callback(
                self._parser(self.subcommand), self.config.get(str(self.subcommand), self.config),
                **self.save_config_kwargs))
        return self.trainer_class(**config)

    def _parser(self, subcommand):
        return self.parser if subcommand is None else self._subcommand_parsers[subcommand]

    def _get(self, config, key, default=None):
        """A value of the config, inside the subcommand's part when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    @staticmethod
    def configure_optimizers(lightning_module, optimizer, lr_scheduler=None):
        """What the module's configure_optimizers returns when --optimizer (and --lr_scheduler) are given; override
        to return something else (Lightning's). ReduceLROnPlateau goes with the metric it monitors."""
        if lr_scheduler is None:
            return optimizer
        if isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
            monitor = getattr(lr_scheduler, "monitor", None)
            if monitor is None:
                raise ValueError("--lr_scheduler torch.optim.lr_scheduler.ReduceLROnPlateau does not say which metric "
                                 "it watches: use tasktrain.cli.ReduceLROnPlateau with --lr_scheduler.monitor "
                                 "val_loss.")
            return {"optimizer": optimizer, "lr_scheduler": {"scheduler": lr_scheduler, "monitor": monitor}}
        return [optimizer], [lr_scheduler]

    def _add_configure_optimizers_method_to_model(self, subcommand):
        """The optimizer and scheduler groups with link_to="AUTOMATIC" (at most one of each) become the module's
        configure_optimizers, which returns self.configure_optimizers(module, optimizer, lr_scheduler)."""
        if not self.auto_configure_optimizers:
            return
        parser = self._parser(subcommand)

        def automatic(register):
            return [key for key, (_, link_to) in register.items() if link_to == "AUTOMATIC"]

        optimizers, schedulers = automatic(parser._optimizers), automatic(parser._lr_schedulers)
        if len(optimizers) > 1 or len(schedulers) > 1:
            raise ValueError(f"{type(self).__name__}: at most one optimizer and one lr_scheduler group can be "
                             f"link_to='AUTOMATIC', found {optimizers + schedulers}. Link the others to the model's "
                             "arguments (link_to='model.<argument>') and build them in configure_optimizers.")

        def init_of(keys, register):
            if not keys:
                return None
            classes, init = register[keys[0]][0], self._get(self.config_init, keys[0])
            if init is not None and not isinstance(classes, tuple):
                init = _with_class_path(classes, init)
            return init or None

        optimizer_init = init_of(optimizers, parser._optimizers)
        scheduler_init = init_of(schedulers, parser._lr_schedulers)
        if optimizer_init is None:
            if scheduler_init is not None:
                raise ValueError("--lr_scheduler was given without --optimizer: the scheduler would be built on an "
                                 "optimizer of the module's configure_optimizers that the CLI cannot see. Give "
                                 "--optimizer too, or build the scheduler in configure_optimizers.")
            return
        from tasktrain.trainer.module import TaskModule, is_overridden

        if is_overridden("configure_optimizers", self.model, TaskModule):
            warnings.warn(f"`{type(self.model).__name__}.configure_optimizers` will be overridden by "
                          f"`{type(self).__name__}.configure_optimizers`: the --optimizer "
                          f"({optimizer_init['class_path']}) and --lr_scheduler given are used.")  # (Lightning's words)
        configure = self.configure_optimizers

        def configure_optimizers(module):
            # built when the trainer asks (after the strategy has wrapped or sharded the module), on its parameters
            optimizer = instantiate_class(module.parameters(), optimizer_init)
            scheduler = None if scheduler_init is None else instantiate_class(optimizer, scheduler_init)
            return configure(module, optimizer, scheduler)

        self.model.configure_optimizers = types.MethodType(configure_optimizers, self.model)

    # -- running --------------------------------------------------------------------------------------------------
    def _set_seed(self):
        from tasktrain.trainer.seed import seed_everything

        seed = self._get(self.config, "seed_everything")
        if seed is False:
            return
        # Lightning's rule: true (or null) seeds with the launcher's seed (TASKTRAIN_GLOBAL_SEED / PL_GLOBAL_SEED),
        # else 0, the same on every process; the saved config holds the seed used, so it repeats the run
        config = self.config[self.subcommand] if self.subcommand else self.config
        config["seed_everything"] = seed_everything(None if seed is True else seed, workers=True)

    def _run_subcommand(self, subcommand):
        """before_<subcommand>(), the CLI's own method of the subcommand's name if it has one else the trainer's,
        with the subcommand's parsed arguments and model= / datamodule=, then after_<subcommand>()."""
        before = getattr(self, f"before_{subcommand}", None)
        if callable(before):
            before()
        run = getattr(self, subcommand, getattr(self.trainer, subcommand))
        run(**self._prepare_subcommand_kwargs(subcommand))
        after = getattr(self, f"after_{subcommand}", None)
        if callable(after):
            after()

    def _prepare_subcommand_kwargs(self, subcommand):
        kwargs = {k: v for k, v in self.config_init[subcommand].items()
                  if k in self._subcommand_method_arguments[subcommand]}
        kwargs["model"] = self.model
        if self.datamodule is not None:
            kwargs["datamodule"] = self.datamodule
        return kwargs
