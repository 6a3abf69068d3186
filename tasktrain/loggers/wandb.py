"""WandbLogger: Weights & Biases runs (the optional extra `pip install 'tasktrain[wandb]'`).

wandb is imported when the logger is constructed (so a missing package is an error before training), never by
`import tasktrain` or `import tasktrain.loggers`.
"""
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional, Union

from tasktrain.loggers.logger import Logger, rank_zero_experiment, rank_zero_method
from tasktrain.loggers.utilities import (add_prefix, check_log_model, checkpoint_metadata, checkpoints_to_log,
                                         convert_params, import_optional, sanitize_callables, scalar)

if TYPE_CHECKING:  # wandb is imported only when the logger is used
    from wandb.sdk.lib import RunDisabled
    from wandb.wandb_run import Run


class WandbLogger(Logger):
    """Log to a Weights & Biases run, created on first use on global rank 0, or when pickled there (ddp_spawn: its
    children attach to the parent's run, as Lightning's) (`experiment` is the `wandb` run; a do-nothing stand-in on
    the other ranks).

    Args:
        name: the run's display name.
        save_dir: where wandb writes its local files (`save_dir/wandb/...`); `dir` is the same (save_dir wins).
        version, id: the run id, to continue a run (resume="allow").
        offline: write the run locally only (`wandb sync` uploads it later); no network.
        anonymous: log without an account ("allow").
        project: the project (default: $WANDB_PROJECT, else "lightning_logs").
        log_model: upload ModelCheckpoint's checkpoints as artifacts: True at the end of a successful fit (the
            kept top k, `last`, the best), "all" as each is saved (also True with save_top_k=-1). With
            `offline=True` it is Lightning's MisconfigurationException; under wandb's mode="offline" (a `wandb.init`
            argument, or WANDB_MODE) the artifacts are recorded with the offline run and uploaded by `wandb sync`.
        experiment: an existing run to log into.
        prefix: put before every metric name, joined with "-".
        checkpoint_name: the artifact's name (default "model-<run id>").
        add_file_policy: "mutable" (copy the checkpoint before upload) or "immutable".
        **kwargs: more `wandb.init` arguments (entity, group, tags, config, mode, ...).

    Metrics are logged with a `trainer/global_step` value, the x-axis of every chart. The run stays open when a
    fit ends (as in Lightning, so that validate/test log into it): `wandb.finish()` ends it (wandb also does at
    exit).
    """

    LOGGER_JOIN_CHAR = "-"
    STEP_METRIC = "trainer/global_step"

    def __init__(
        self,
        name: Optional[str] = None,
        save_dir: Union[str, Path] = ".",
        version: Optional[str] = None,
        offline: bool = False,
        dir: Optional[Union[str, Path]] = None,
        id: Optional[str] = None,
        anonymous: Optional[bool] = None,
        project: Optional[str] = None,
        log_model: Union[Literal["all"], bool] = False,
        experiment: Union["Run", "RunDisabled", None] = None,
        prefix: str = "",
        checkpoint_name: Optional[str] = None,
        add_file_policy: Literal["mutable", "immutable"] = "mutable",
        **kwargs,
    ):
        import_optional("wandb", "wandb", "WandbLogger")
        if offline and log_model:  # Lightning's refusal, its words (wandb's own mode="offline" is not refused)
            from tasktrain.exceptions import MisconfigurationException

            raise MisconfigurationException(
                f"Providing log_model={log_model} and offline={offline} is an invalid configuration since model "
                "checkpoints cannot be uploaded in offline mode.\nHint: Set `offline=False` to log your model.")
        check_log_model(log_model, "WandbLogger")
        if add_file_policy not in ("mutable", "immutable"):
            raise ValueError(f"WandbLogger(add_file_policy={add_file_policy!r}): use 'mutable' or 'immutable'.")
        if offline and kwargs.get("mode", "offline") != "offline":
            raise ValueError(f"WandbLogger(offline=True, mode={kwargs['mode']!r}) contradict each other: keep one.")
        save_dir = os.fspath(save_dir) if save_dir is not None else None
        dir = os.fspath(dir) if dir is not None else None
        self._wandb_init = {
            "name": name,
            "project": project or os.environ.get("WANDB_PROJECT", "lightning_logs"),
            "dir": save_dir or dir,
            "id": version or id,
            "resume": "allow",
            "anonymous": "allow" if anonymous else None,
        }
        if offline:
            self._wandb_init["mode"] = "offline"  # this run only, unlike setting WANDB_MODE for the whole process
        self._wandb_init.update(kwargs)
        self._offline = offline
        self._log_model = log_model
        self._prefix = prefix
        self._experiment = experiment
        self._attach_id = None  # the parent's run, in a logger unpickled by a ddp_spawn child (__getstate__)
        self._checkpoint_name = checkpoint_name
        self.add_file_policy = add_file_policy
        self._checkpoint_callbacks = {}
        self._logged_model_time = {}
        self._step_metric = True  # the tracker API (Accelerate semantics) logs with wandb's own step instead

    # -- what it is ----------------------------------------------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self):
        """The wandb Run (created on first use)."""
        if self._experiment is not None and getattr(self._experiment, "_is_finished", False):
            # wandb.finish() ended it: a later fit/test with this logger continues the same run (resume="allow")
            self._wandb_init["id"] = self._experiment.id
            self._experiment = self._attach_id = None  # (a finished run cannot be attached to)
        if self._experiment is None:
            import wandb

            if wandb.run is not None:
                warnings.warn("A wandb run is already active in this process: WandbLogger logs into it. Call "
                              "wandb.finish() before creating the logger to start a new run.")
                self._experiment = wandb.run
            elif self._attach_id is not None:
                # unpickled in a ddp_spawn child: the parent's run, through wandb's service (Lightning's attach)
                self._experiment = wandb._attach(self._attach_id)
            else:
                self._experiment = wandb.init(**{k: v for k, v in self._wandb_init.items() if v is not None})
                if not callable(getattr(self._experiment, "define_metric", None)):
                    pass  # (a run object without it, e.g. a stand-in: Lightning skips the x-axis too)
                elif self._step_metric and self._wandb_init.get("sync_tensorboard"):
                    # (Lightning's: TensorBoard's own steps, which wandb reads as "global_step", are the x-axis)
                    self._experiment.define_metric("*", step_metric="global_step")
                elif self._step_metric:
                    self._experiment.define_metric(self.STEP_METRIC)
                    self._experiment.define_metric("*", step_metric=self.STEP_METRIC, step_sync=True)
        return self._experiment

    @property
    def name(self):
        """The project (the run's own name is `experiment.name`)."""
        return self._wandb_init["project"]

    @property
    def version(self):
        """The run id (without creating the run)."""
        return self._experiment.id if self._experiment is not None else self._wandb_init["id"]

    @property
    def save_dir(self):
        return self._wandb_init["dir"]

    def setup(self, trainer, pl_module, stage):
        super().setup(trainer, pl_module, stage)
        if self._is_global_zero():
            self.experiment  # the run id names the checkpoint folder (save_dir/project/<id>/checkpoints)

    # -- writing -------------------------------------------------------------------------------------------------
    @rank_zero_method
    def log_hyperparams(self, params):
        params = sanitize_callables(convert_params(params))
        self.experiment.config.update(params, allow_val_change=True)

    @rank_zero_method
    def log_metrics(self, metrics, step=None):
        metrics = {k: scalar(v) for k, v in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items()}
        if step is not None and not self._wandb_init.get("sync_tensorboard"):
            metrics[self.STEP_METRIC] = step
        self.experiment.log(metrics)

    @rank_zero_method
    def log_table(self, key, columns=None, data=None, dataframe=None, step=None):
        """A wandb.Table from columns and rows (data), or from a pandas dataframe."""
        import wandb

        self.log_metrics({key: wandb.Table(columns=columns, data=data, dataframe=dataframe)}, step)

    def log_text(self, key, columns=None, data=None, dataframe=None, step=None):
        """Text rows, as a table."""
        self.log_table(key, columns, data, dataframe, step)

    @rank_zero_method
    def log_image(self, key, images, step=None, **kwargs):
        """A list of images (tensors, numpy arrays, PIL images, file paths) under `key`, each a wandb.Image; each
        keyword is a list with one value per image (caption=[...], masks=[...], boxes=[...])."""
        self._log_media(key, images, "images", "Image", step, kwargs)

    @rank_zero_method
    def log_audio(self, key, audios, step=None, **kwargs):
        """A list of audio clips (numpy arrays, file paths), each a wandb.Audio (caption=[...], sample_rate=[...])."""
        self._log_media(key, audios, "audios", "Audio", step, kwargs)

    @rank_zero_method
    def log_video(self, key, videos, step=None, **kwargs):
        """A list of videos (numpy arrays, file paths), each a wandb.Video (caption=[...], fps=[...], format=[...])."""
        self._log_media(key, videos, "videos", "Video", step, kwargs)

    def _log_media(self, key, items, noun, kind, step, per_item):
        if not isinstance(items, list):  # (Lightning's errors, its words)
            raise TypeError(f'Expected a list as "{noun}", found {type(items)}')
        for name, values in per_item.items():
            if len(values) != len(items):
                raise ValueError(f"Expected {len(items)} items but only found {len(values)} for {name}")
        import wandb

        media = getattr(wandb, kind)
        self.log_metrics({key: [media(item, **{name: values[i] for name, values in per_item.items()})
                                for i, item in enumerate(items)]}, step)

    @staticmethod
    def download_artifact(artifact, save_dir=None, artifact_type=None, use_artifact=True):
        """Download a W&B artifact ("entity/project/name:version") into save_dir (wandb's folder when None) and
        return the folder. Inside an active run with use_artifact=True the run records that it used it."""
        import wandb

        if wandb.run is not None and use_artifact:
            found = wandb.run.use_artifact(artifact)
        else:
            found = wandb.Api().artifact(artifact, type=artifact_type)
        return found.download(root=None if save_dir is None else os.fspath(save_dir))

    def use_artifact(self, artifact, artifact_type=None):
        """The run's use of a W&B artifact (recorded in the run's lineage): wandb's Artifact."""
        return self.experiment.use_artifact(artifact, type=artifact_type)

    @rank_zero_method
    def watch(self, model, log="gradients", log_freq=100, log_graph=True):
        """wandb's gradient/parameter histograms of `model` every log_freq backward passes."""
        self.experiment.watch(model, log=log, log_freq=log_freq, log_graph=log_graph)

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def after_save_checkpoint(self, checkpoint_callback):
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._log_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callbacks[id(checkpoint_callback)] = checkpoint_callback

    @rank_zero_method
    def finalize(self, status):
        if status != "success" or self._experiment is None:
            return  # checkpoints are uploaded after a successful run only
        for checkpoint_callback in self._checkpoint_callbacks.values():
            self._log_checkpoints(checkpoint_callback)

    @rank_zero_method
    def _log_checkpoints(self, checkpoint_callback):
        import wandb

        for mtime, path, score, is_best in checkpoints_to_log(checkpoint_callback, self._logged_model_time):
            name = self._checkpoint_name or f"model-{self.experiment.id}"
            artifact = wandb.Artifact(name=name, type="model",
                                      metadata=checkpoint_metadata(checkpoint_callback, path, score,
                                                                    type(checkpoint_callback).__name__))
            if os.path.isdir(path):  # a DeepSpeed checkpoint is a folder
                artifact.add_dir(path, name="model.ckpt", policy=self.add_file_policy)
            else:
                artifact.add_file(path, name="model.ckpt", policy=self.add_file_policy)
            self.experiment.log_artifact(artifact, aliases=["latest", "best"] if is_best else ["latest"])
            self._logged_model_time[path] = mtime

    def __getstate__(self):
        # ddp_spawn pickles the logger for its children: as Lightning's, rank 0 (the parent) starts the run here, and
        # the children attach to it through wandb's service, so the parent and its children log into one run and the
        # parent's `experiment` after the fit is the run its children wrote (a live run object itself cannot travel).
        self.experiment  # (a stand-in, and no run, on the other ranks)
        state = self.__dict__.copy()
        if self._experiment is not None:
            state["_wandb_init"] = {**self._wandb_init, "id": self._experiment.id}  # without attach: the same id
            state["_attach_id"] = getattr(self._experiment, "_attach_id", None)
        state["_experiment"] = None
        return state
