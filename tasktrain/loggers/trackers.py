"""Trackers: the Accelerator's experiment tracking (Accelerate's `GeneralTracker` API) over the same back-ends as
the Trainer's loggers. A tracker owns one logger of tasktrain.loggers and maps Accelerate's calls onto it, so a
run written by `Accelerator(log_with="tensorboard")` and one written by `Trainer(logger=TensorBoardLogger(...))`
are the same kind of files.

For the Accelerator (issue 16): the whole API it needs is two functions and the GeneralTracker class.

    from tasktrain.loggers.trackers import GeneralTracker, check_log_with, make_trackers

    # Accelerator.__init__(log_with=None, project_dir=None, ...): validate up front, on every rank alike
    self.log_with = check_log_with(log_with, self.logging_dir)       # raises on a bad name / missing package / dir

    # init_trackers(project_name, config=None, init_kwargs=None): on the main process only
    self.trackers = make_trackers(self.log_with, project_name, config, self.logging_dir, init_kwargs) \\
        if self.is_main_process else []

    # log(values, step=None, log_kwargs=None): main process only
    for tracker in self.trackers:
        tracker.log(values, step=step, **(log_kwargs or {}).get(tracker.name, {}))

    # get_tracker(name, unwrap=False): Accelerate's rule
    for tracker in self.trackers:
        if tracker.name == name:
            return tracker.tracker if unwrap else tracker
    if self.trackers: raise ValueError(f"{name} is not an available tracker stored inside the `Accelerator`.")
    return GeneralTracker(_blank=True)          # the other processes get a do-nothing tracker

    # end_training(): for tracker in self.trackers: tracker.finish()

`log_with` takes what Accelerate's does: "tensorboard" | "wandb" | "mlflow" | "all" | a LoggerType | a
GeneralTracker instance | a list of these, plus "csv" (ours). "all" means every tracker of Accelerate's that is
installed here (tensorboard, wandb, mlflow); "csv" only when named. Trackers Accelerate has and we do not (aim,
comet_ml, clearml, dvclive, swanlab, trackio) are a clear error: pass a GeneralTracker of your own instead.
A tracker named explicitly whose package is missing is an error naming the extra (Accelerate skips it quietly).

`init_kwargs[name]` goes to that tracker's constructor as in Accelerate: SummaryWriter arguments for
"tensorboard", `wandb.init` arguments for "wandb", MLflowTracker's (logging_dir, run_id, tags, nested_run,
run_name, description) for "mlflow", CSVLogger's (flush_logs_every_n_steps, prefix) for "csv".
"""
import importlib.util
import json
import os
import warnings
from enum import Enum

from tasktrain.loggers.utilities import import_optional, scalar


class LoggerType(str, Enum):
    """Accelerate's tracker names (`tasktrain.utils.LoggerType` re-exports this)."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"
    TRACKIO = "trackio"
    CSV = "csv"

    def __str__(self):
        return self.value


class GeneralTracker:
    """The base of every tracker, Accelerate's contract: `name`, `requires_logging_directory`, `tracker` (the
    underlying writer or run), `start()`, `store_init_configuration(values)`, `log(values, step=None,
    **kwargs)`, `finish()`. Subclass it for a tracker of your own and pass the instance in `log_with`.

    `GeneralTracker(_blank=True)` is a tracker whose methods do nothing (what processes other than the main one
    get from get_tracker).
    """

    main_process_only = True

    def __init__(self, _blank=False):
        if _blank:
            return
        missing = [attr for attr in ("name", "requires_logging_directory") if not hasattr(self, attr)]
        if "tracker" not in dir(self):
            missing.append("tracker")
        if missing:
            raise NotImplementedError(f"{type(self).__name__} must define {', '.join(missing)} (see GeneralTracker).")

    def start(self):
        """Create the run or writer (called by init_trackers, before store_init_configuration)."""

    def store_init_configuration(self, values: dict):
        """Record `values` as the run's hyper-parameters."""

    def log(self, values: dict, step=None, **kwargs):
        """Record `values` at `step`."""

    def finish(self):
        """Close the run or writer."""


class TensorBoardTracker(GeneralTracker):
    """TensorBoard event files in logging_dir/run_name (a TensorBoardLogger with no version folder);
    hyper-parameters in hparams.yaml there and in the HPARAMS tab. `log` writes numbers with add_scalar, text
    with add_text, dicts of numbers with add_scalars, and flushes; other values are skipped with a warning."""

    name = "tensorboard"
    requires_logging_directory = True

    def __init__(self, run_name, logging_dir, **kwargs):
        super().__init__()
        from tasktrain.loggers.tensorboard import TensorBoardLogger

        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.logger = TensorBoardLogger(logging_dir, name="", version=run_name, default_hp_metric=False, **kwargs)
        self._warned = set()

    def start(self):
        self.logger.experiment

    @property
    def tracker(self):
        return self.logger.experiment

    def store_init_configuration(self, values):
        self.logger.log_hyperparams(values)
        self.logger.save()

    def log(self, values, step=None, **kwargs):
        numbers = {}
        for key, value in values.items():
            value = scalar(value)
            if isinstance(value, str):
                self.logger.experiment.add_text(key, value, global_step=step, **kwargs)
            elif isinstance(value, (int, float)) or (isinstance(value, dict) and value):
                numbers[key] = value
            else:
                _warn_once(self._warned, key, f"TensorBoard tracker: {key}={value!r} is not a number, text or a dict "
                                              "of numbers: not logged.")
        self.logger.log_metrics(numbers, step, **kwargs)
        self.logger.save()

    def finish(self):
        self.logger.finalize("success")


class CSVTracker(GeneralTracker):
    """metrics.csv and hparams.yaml in logging_dir/run_name (a CSVLogger with no version folder); one row per
    `log` call (step=None: the row's number), written as it is logged. Dicts are flattened ("loss/train")."""

    name = "csv"
    requires_logging_directory = True

    def __init__(self, run_name, logging_dir, flush_logs_every_n_steps=1, prefix=""):
        super().__init__()
        from tasktrain.loggers.csv_logs import CSVLogger

        self.run_name = run_name
        self.logging_dir = os.path.join(os.fspath(logging_dir), run_name)
        self.logger = CSVLogger(logging_dir, name="", version=run_name, prefix=prefix,
                                flush_logs_every_n_steps=flush_logs_every_n_steps)

    @property
    def tracker(self):
        return self.logger.experiment

    def store_init_configuration(self, values):
        self.logger.log_hyperparams(values)

    def log(self, values, step=None, **kwargs):
        if kwargs:
            raise TypeError(f"The csv tracker's log takes no keyword arguments; got {sorted(kwargs)}.")
        from tasktrain.loggers.utilities import flatten_dict

        self.logger.log_metrics(flatten_dict(values), step)

    def finish(self):
        self.logger.finalize("success")


class WandBTracker(GeneralTracker):
    """A wandb run in project `run_name` (`wandb.init(project=run_name, **kwargs)`, through WandbLogger).
    `log(values, step, **kwargs)` is `run.log(values, step=step, **kwargs)` (wandb's own step axis);
    `store_init_configuration` updates the run's config; `finish` finishes the run."""

    name = "wandb"
    requires_logging_directory = False

    def __init__(self, run_name, **kwargs):
        super().__init__()
        from tasktrain.loggers.wandb import WandbLogger

        self.run_name = run_name
        self.logger = WandbLogger(project=run_name, save_dir=None, **kwargs)
        self.logger._step_metric = False  # Accelerate's charts use wandb's step, not trainer/global_step

    def start(self):
        self.logger.experiment

    @property
    def tracker(self):
        return self.logger.experiment

    def store_init_configuration(self, values):
        self.logger.log_hyperparams(values)

    def log(self, values, step=None, **kwargs):
        self.logger.experiment.log({k: scalar(v) for k, v in values.items()}, step=step, **kwargs)

    def finish(self):
        self.logger.experiment.finish()


class MLflowTracker(GeneralTracker):
    """An MLflow run (through MLFlowLogger) in the tracking store MLflow is set to ($MLFLOW_TRACKING_URI or
    `mlflow.set_tracking_uri`, else MLflow's default), made MLflow's active run so that `mlflow.log_*` calls of
    the script land in it too. Accelerate's arguments; $MLFLOW_EXPERIMENT_NAME, $MLFLOW_RUN_ID, $MLFLOW_TAGS
    (JSON) and $MLFLOW_NESTED_RUN win over them. `logging_dir` is where a new experiment keeps its artifacts.
    `log` writes numbers; other values are skipped with a warning (MLflow metrics are numbers)."""

    name = "mlflow"
    requires_logging_directory = False

    def __init__(self, experiment_name=None, logging_dir=None, run_id=None, tags=None, nested_run=False,
                 run_name=None, description=None):
        super().__init__()
        mlflow = import_optional("mlflow", "mlflow", "The mlflow tracker")
        from tasktrain.loggers.mlflow import MLFlowLogger

        experiment_name = os.environ.get("MLFLOW_EXPERIMENT_NAME", experiment_name)
        run_id = os.environ.get("MLFLOW_RUN_ID", run_id)
        tags = os.environ.get("MLFLOW_TAGS", tags)
        if isinstance(tags, str):
            tags = json.loads(tags)
        nested = os.environ.get("MLFLOW_NESTED_RUN", nested_run)
        self.nested_run = nested if isinstance(nested, bool) else str(nested).lower() in ("1", "true", "yes")
        tags = dict(tags or {})
        if description is not None:
            tags["mlflow.note.content"] = description
        parent = mlflow.active_run()
        if self.nested_run and parent is not None and run_id is None:
            tags["mlflow.parentRunId"] = parent.info.run_id
        self.experiment_name = experiment_name
        self.logging_dir = logging_dir
        self.logger = MLFlowLogger(experiment_name=experiment_name or "Default", run_name=run_name,
                                   tracking_uri=mlflow.get_tracking_uri(), tags=tags, save_dir=None,
                                   artifact_location=None if logging_dir is None else os.fspath(logging_dir),
                                   run_id=run_id)
        self.active_run = None
        self._warned = set()

    def start(self):
        import mlflow

        run_id = self.logger.run_id  # creates the experiment and the run
        self.active_run = mlflow.start_run(run_id=run_id, nested=self.nested_run)

    @property
    def tracker(self):
        return self.active_run

    def store_init_configuration(self, values):
        self.logger.log_hyperparams(values)

    def log(self, values, step=None, **kwargs):
        if kwargs:
            raise TypeError(f"The mlflow tracker's log takes no keyword arguments; got {sorted(kwargs)}.")
        numbers = {}
        for key, value in values.items():
            value = scalar(value)
            if isinstance(value, (int, float)):
                numbers[key] = value
            else:
                _warn_once(self._warned, key, f"MLflow tracker: {key}={value!r} is not a number (MLflow metrics "
                                              "are numbers): not logged.")
        self.logger.log_metrics(numbers, step)

    def finish(self):
        import mlflow

        active = mlflow.active_run()
        if active is not None and active.info.run_id == self.logger.run_id:
            mlflow.end_run()  # marks it FINISHED
        else:
            self.logger.finalize("success")


def _warn_once(seen, key, message):
    if key not in seen:
        seen.add(key)
        warnings.warn(message)


TRACKERS = {"tensorboard": TensorBoardTracker, "wandb": WandBTracker, "mlflow": MLflowTracker, "csv": CSVTracker}
# (the module each needs, the extra that installs it; None: a dependency of tasktrain)
_PACKAGES = {"tensorboard": ("tensorboard", None), "wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow"),
             "csv": (None, None)}
_ALL = ("tensorboard", "wandb", "mlflow")  # what Accelerate's "all" can mean here
_NOT_HERE = ("aim", "comet_ml", "clearml", "dvclive", "swanlab", "trackio")


def _installed(module):
    if module is None:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (blocked)
        return False


def available_trackers():
    """The tracker names whose package is installed here (Accelerate's get_available_trackers)."""
    return [name for name in TRACKERS if _installed(_PACKAGES[name][0])]


def check_log_with(log_with, logging_dir=None):
    """Accelerator(log_with=...) checked before anything runs: a list of tracker names and GeneralTracker
    instances, without repeats. Raises on an unknown name, a tracker whose package is missing (naming the extra),
    and a tracker that writes files when there is no logging_dir."""
    if log_with is None:
        return []
    items = list(log_with) if isinstance(log_with, (list, tuple)) else [log_with]
    chosen = []
    for item in items:
        if isinstance(item, GeneralTracker):
            chosen.append(item)
            continue
        if isinstance(item, type) and issubclass(item, GeneralTracker):
            raise TypeError(f"log_with got the class {item.__name__}: pass an instance, {item.__name__}(...).")
        name = str(item.value if isinstance(item, LoggerType) else item).lower()
        if name == "all":
            names = [n for n in _ALL if _installed(_PACKAGES[n][0])]
        elif name in TRACKERS:
            module, extra = _PACKAGES[name]
            if not _installed(module):
                how = f"pip install 'tasktrain[{extra}]'" if extra else f"pip install {module}"
                raise ModuleNotFoundError(f"log_with={name!r} needs the `{module}` package, which is not installed: "
                                          f"{how}.")
            names = [name]
        elif name in _NOT_HERE:
            raise ValueError(f"log_with={name!r}: tasktrain has no {name} tracker (it has {sorted(TRACKERS)}). "
                             "Write one as a GeneralTracker subclass and pass the instance in log_with.")
        else:
            raise ValueError(f"log_with={item!r} is not a tracker: use one of {sorted(TRACKERS)}, 'all', a "
                             "GeneralTracker instance, or a list of these.")
        for n in names:
            if TRACKERS[n].requires_logging_directory and logging_dir is None:
                raise ValueError(f"log_with={item!r} includes {n}, which writes files under a logging directory, and "
                                 "none is set: pass Accelerator(project_dir=...) (or a ProjectConfiguration with "
                                 "logging_dir).")
            if n not in chosen:
                chosen.append(n)
    return chosen


def make_trackers(log_with, project_name, config=None, logging_dir=None, init_kwargs=None):
    """The trackers of `Accelerator.init_trackers(project_name, config, init_kwargs)`, started, with `config`
    stored as their hyper-parameters. Call it on the main process only. `init_kwargs` maps a tracker name to
    its constructor's keyword arguments ({"wandb": {"tags": ["a"]}}); a key that names no tracker is an error,
    a key for a known tracker that log_with does not use is not (scripts pass wandb's while logging elsewhere).
    """
    init_kwargs = dict(init_kwargs or {})
    unknown = [key for key in init_kwargs if key not in TRACKERS and key not in _NOT_HERE]
    if unknown:
        raise ValueError(f"init_kwargs has keys {unknown} that name no tracker; use the names of log_with "
                         f"({sorted(TRACKERS)}).")
    trackers = []
    for entry in check_log_with(log_with, logging_dir):
        if isinstance(entry, GeneralTracker):
            trackers.append(entry)
            continue
        cls = TRACKERS[entry]
        kwargs = init_kwargs.get(entry, {})
        if cls.requires_logging_directory:
            trackers.append(cls(project_name, logging_dir, **kwargs))
        else:  # wandb: the project; mlflow: the experiment's name (as in Accelerate)
            trackers.append(cls(project_name, **kwargs))
    for tracker in trackers:
        tracker.start()
    if config is not None:
        for tracker in trackers:
            tracker.store_init_configuration(config)
    return trackers
