"""CometLogger: Comet experiments (the optional extra `pip install 'tasktrain[comet]'`, which installs comet_ml);
Lightning's `lightning.pytorch.loggers.comet` path.

comet_ml is imported when the logger is constructed (so a missing package is an error before training), never by
`import tasktrain` or `import tasktrain.loggers`.
"""
import inspect
import logging
import os
from typing import Literal, Optional

from tasktrain.loggers.logger import Logger, rank_zero_experiment, rank_zero_method
from tasktrain.loggers.utilities import convert_params, import_optional

__all__ = ["CometLogger"]

log = logging.getLogger(__name__)  # (Lightning says its deprecated arguments through its module's logger too)

FRAMEWORK_NAME = "pytorch-lightning"  # what Comet's UI shows a run came from: Lightning's, so runs compare there

# Lightning's old argument names, each with the one that replaced it
_RENAMED = (("experiment_name", "name"), ("project_name", "project"), ("offline", "online"),
            ("save_dir", "offline_directory"))


class CometLogger(Logger):
    """Log to a Comet experiment (`comet_ml.start`), created with the logger on global rank 0 (`experiment` is the
    comet_ml experiment there; a do-nothing stand-in on the other ranks).

    Args:
        api_key: Comet's API key (default: Comet's configuration, `comet login` or $COMET_API_KEY).
        workspace: the workspace (default: the account's default).
        project: the project (default: Comet's, "Uncategorized" online; none offline).
        experiment_key: the experiment's key: continue that experiment, or give a new one its key (32 to 50
            letters and digits).
        mode: "get_or_create" (Comet's default), "get" (continue experiment_key) or "create" (always a new one).
        online: False writes an offline archive (`<offline_directory>/<key>-<suffix>.zip`, uploaded later with
            `comet upload`), True logs to the Comet server; None is Comet's configuration ($COMET_START_ONLINE),
            else online.
        prefix: put before every metric name, joined with "_" by Comet.
        **kwargs: comet_ml.ExperimentConfig's arguments: `name` (the experiment's name), `offline_directory`
            (default: Comet's configuration, else ".cometml-runs"), `tags`, `log_code`, `log_env_details`,
            `auto_output_logging`, `display_summary_level`, ... Lightning's old names are taken with its warning:
            experiment_name (name), project_name (project), offline (the opposite of online), save_dir
            (offline_directory).

    `name` is the project, `version` the experiment key, `save_dir` the offline directory (also online: Lightning's
    rule, so checkpoints go under save_dir/<project>/<key>/checkpoints). The experiment stays open when a run ends
    (its data is flushed), so that validate and test log into it: `logger.experiment.end()` ends it (writing the
    offline archive), and comet_ml does so at exit; a logger whose experiment was ended continues the same
    experiment key when it is used again.
    """

    def __init__(
        self,
        *,
        api_key: Optional[str] = None,
        workspace: Optional[str] = None,
        project: Optional[str] = None,
        experiment_key: Optional[str] = None,
        mode: Optional[Literal["get_or_create", "get", "create"]] = None,
        online: Optional[bool] = None,
        prefix: Optional[str] = None,
        **kwargs,
    ):
        for old, new in _RENAMED:
            if old in kwargs:
                project, online = self._renamed(old, new, kwargs, project, online)
        # Lightning's, before comet_ml's first import: no patching of frameworks for comet_ml's automatic logging
        # (torch is imported already, so comet_ml could not log it anyway)
        os.environ["COMET_DISABLE_AUTO_LOGGING"] = "1"
        comet_ml = import_optional("comet_ml", "comet", "CometLogger")
        if not callable(getattr(comet_ml, "start", None)) or not hasattr(comet_ml, "ExperimentConfig"):
            raise ModuleNotFoundError(
                f"CometLogger needs comet_ml>=3.44.4 (comet_ml.start and ExperimentConfig); this is comet_ml "
                f"{getattr(comet_ml, '__version__', '?')}. Upgrade it: `pip install -U 'tasktrain[comet]'`.")
        accepted = inspect.signature(comet_ml.ExperimentConfig).parameters
        # a **kwargs of its own (a comet_ml that forwards them, or a stand-in such as a Mock) takes any name
        takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values())
        unknown = [] if takes_any else sorted(set(kwargs) - set(accepted))
        if unknown:
            raise TypeError(f"CometLogger got {unknown}: neither its own arguments nor comet_ml.ExperimentConfig's "
                            f"({', '.join(accepted)}).")
        self._api_key = api_key
        self._workspace = workspace
        self._project_name = project
        self._experiment_key = experiment_key
        self._mode = mode
        self._online = online
        self._prefix = prefix
        self._kwargs = kwargs
        self._experiment = None
        self._comet_config = comet_ml.ExperimentConfig(**kwargs)
        if self._is_global_zero():  # Lightning's: made now, on rank 0 only (its key names the checkpoint folder)
            self._create_experiment()

    @staticmethod
    def _renamed(old, new, kwargs, project, online):
        """Lightning's old argument `old` taken as `new`, with Lightning's warnings; where both are given the new one
        is kept (Lightning then fails inside comet_ml on the old one, which it leaves in place)."""
        log.warning(f"The parameter `{old}` is deprecated, please use `{new}` instead.")
        value = kwargs.pop(old)
        given = {"project": project is not None, "online": online is not None}.get(new, new in kwargs)
        if given:
            log.warning(f"You specified both `{old}` and `{new}` parameters, please use `{new}` only")
        elif new == "project":
            project = value
        elif new == "online":
            # (Lightning takes offline=True as online=True: Lightning-AI/pytorch-lightning#21921)
            online = None if value is None else not value
        else:
            kwargs[new] = value
        return project, online

    def _create_experiment(self):
        import comet_ml

        self._experiment = comet_ml.start(api_key=self._api_key, workspace=self._workspace,
                                          project=self._project_name, experiment_key=self._experiment_key,
                                          mode=self._mode, online=self._online, experiment_config=self._comet_config)
        if self._experiment is None:  # (Lightning's error)
            raise comet_ml.exceptions.ExperimentNotFound("Failed to create Comet experiment.")
        self._experiment_key = self._experiment.get_key()
        self._project_name = self._experiment.project_name
        self._experiment.log_other("Created from", FRAMEWORK_NAME)

    # -- what it is ----------------------------------------------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self):
        """The comet_ml experiment (an OfflineExperiment when offline)."""
        if self._experiment is not None and self._experiment.ended:
            # experiment.end() ended it: continue the same key (online the same experiment, offline a new archive
            # that `comet upload` adds to it) rather than drop what is logged next, as Lightning's logger does
            log.info(f"CometLogger: experiment {self._experiment_key} was ended; continuing it.")
            self._experiment = None
        if self._experiment is None:  # not made yet here (a logger unpickled in a ddp_spawn worker)
            self._create_experiment()
        return self._experiment

    @property
    def name(self):
        """The project (None offline when none was given)."""
        return self._project_name

    @property
    def version(self):
        """The experiment key (None before the experiment exists: on the other ranks, in a worker before first use)."""
        return self._experiment.get_key() if self._experiment is not None else None

    @property
    def save_dir(self):
        """Comet's offline directory (also when online: Lightning's rule)."""
        return self._comet_config.offline_directory

    # -- writing -------------------------------------------------------------------------------------------------
    @rank_zero_method
    def log_hyperparams(self, params):
        """Nested dicts are flattened by Comet ("opt|lr")."""
        self.experiment.__internal_api__log_parameters__(parameters=convert_params(params), framework=FRAMEWORK_NAME,
                                                         flatten_nested=True, source="manual")

    @rank_zero_method
    def log_metrics(self, metrics, step=None):
        """`epoch` is Comet's epoch of the other values, not a metric (Lightning's rule)."""
        metrics = {key: value.detach().cpu() if callable(getattr(value, "detach", None)) else value
                   for key, value in metrics.items()}  # (a copy: the caller's tensors keep their graph)
        epoch = metrics.pop("epoch", None)
        self.experiment.__internal_api__log_metrics__(metrics, step=step, epoch=epoch, prefix=self._prefix,
                                                      framework=FRAMEWORK_NAME)

    def log_graph(self, model, input_array=None):
        """The module's printed structure as the experiment's graph (once per experiment: Comet keeps the first)."""
        if self._experiment is not None:  # (Lightning's: no experiment is made for it)
            self._experiment.__internal_api__set_model_graph__(graph=model, framework=FRAMEWORK_NAME)

    @rank_zero_method
    def finalize(self, status):
        """Flush, and leave the experiment open (Lightning's rule: validate/test after fit log into it)."""
        if self._experiment is not None:
            self._experiment.flush()

    def __getstate__(self):
        # A live experiment cannot travel to another process (ddp_spawn): the worker continues the same key.
        state = self.__dict__.copy()
        if self._experiment is not None:
            state["_experiment_key"] = self._experiment.get_key()
        state["_experiment"] = None
        return state
