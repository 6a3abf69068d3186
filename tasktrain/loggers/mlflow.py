"""MLFlowLogger: MLflow runs (the optional extra `pip install 'tasktrain[mlflow]'`, which installs mlflow-skinny).

mlflow is imported when the logger is constructed (so a missing package is an error before training), never by
`import tasktrain` or `import tasktrain.loggers`.
"""
import os
import re
import tempfile
import time
import warnings
from typing import Any, Literal, Optional

from tasktrain.loggers.logger import Logger, rank_zero_experiment, rank_zero_method
from tasktrain.loggers.utilities import (add_prefix, check_log_model, checkpoint_metadata, checkpoints_to_log,
                                         convert_params, flatten_dict, import_optional, scalar)

LOCAL_FILE_URI_PREFIX = "file:"
_BAD_METRIC_CHARS = re.compile(r"[^a-zA-Z0-9_/. -]+")


def allow_file_store(tracking_uri):
    """MLflow 3 keeps its file store ("./mlruns") in maintenance mode and refuses it unless
    MLFLOW_ALLOW_FILE_STORE is true. A logger given a file URI (or save_dir) asked for exactly that store, so the
    variable is set for this process when it is unset; an explicit "false" is left alone (MLflow then says why)."""
    if tracking_uri.startswith(LOCAL_FILE_URI_PREFIX) or "://" not in tracking_uri:
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")


class MLFlowLogger(Logger):
    """Log to an MLflow run, created on first use on global rank 0 (`experiment` is the `MlflowClient`; a
    do-nothing stand-in on the other ranks).

    Args:
        experiment_name: the experiment (created when it does not exist).
        run_name: the new run's name.
        tracking_uri: where MLflow stores runs: "file:./mlruns", "sqlite:///mlflow.db" (needs sqlalchemy and
            alembic, or the full mlflow package), "http://host:5000", ... Default: $MLFLOW_TRACKING_URI, else
            "file:" + save_dir.
        tags: the run's tags.
        save_dir: the file store's folder when no tracking_uri is given.
        log_model: upload ModelCheckpoint's checkpoints as run artifacts: True at the end of a successful fit,
            "all" as each is saved (also True with save_top_k=-1).
        prefix: put before every metric name, joined with "-".
        artifact_location: where a new experiment keeps its artifacts.
        run_id: continue this run instead of creating one.
        synchronous: MLflow's synchronous flag for log_batch (None: MLflow's default).
        checkpoint_path_prefix: put before each checkpoint's artifact path.

    `name` is the experiment id and `version` the run id (reading either creates the run).
    """

    LOGGER_JOIN_CHAR = "-"

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: Optional[str] = None,
        tracking_uri: Optional[str] = None,
        tags: Optional[dict[str, Any]] = None,
        save_dir: Optional[str] = "./mlruns",
        log_model: Literal[True, False, "all"] = False,
        prefix: str = "",
        artifact_location: Optional[str] = None,
        run_id: Optional[str] = None,
        synchronous: Optional[bool] = None,
        checkpoint_path_prefix: str = "",
    ):
        import_optional("mlflow", "mlflow", "MLFlowLogger")
        check_log_model(log_model, "MLFlowLogger")
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if not tracking_uri:
            if save_dir is None:
                raise ValueError("MLFlowLogger: no tracking_uri, no $MLFLOW_TRACKING_URI and save_dir=None: say where "
                                 "runs go (save_dir='./mlruns', or tracking_uri='sqlite:///mlflow.db').")
            tracking_uri = f"{LOCAL_FILE_URI_PREFIX}{os.fspath(save_dir)}"
        allow_file_store(tracking_uri)
        from mlflow.tracking import MlflowClient

        self._experiment_name = experiment_name
        self._experiment_id = None
        self._tracking_uri = tracking_uri
        self._run_name = run_name
        self._run_id = run_id
        self.tags = dict(tags) if tags else {}
        self._log_model = log_model
        self._prefix = prefix
        self._artifact_location = artifact_location
        self._log_batch_kwargs = {} if synchronous is None else {"synchronous": synchronous}
        self._checkpoint_path_prefix = checkpoint_path_prefix
        self._checkpoint_callback = None
        self._logged_model_time = {}
        self._initialized = False
        self._mlflow_client = MlflowClient(tracking_uri)

    # -- what it is ----------------------------------------------------------------------------------------------
    @property
    @rank_zero_experiment
    def experiment(self):
        """The MlflowClient; the experiment and the run exist once this returns."""
        if self._initialized:
            return self._mlflow_client
        import mlflow

        # Lightning's: this logger's store becomes MLflow's process-wide one, so that mlflow.log_*() called from the
        # user's code writes beside the logger's run. MLflow 3 also writes $MLFLOW_TRACKING_URI (for its
        # subprocesses): the variable is put back as the user had it, so that a logger built later in this process
        # defaults to what Lightning's would (its default is the variable read once, when Lightning is imported)
        previous = os.environ.get("MLFLOW_TRACKING_URI")
        mlflow.set_tracking_uri(self._tracking_uri)
        if previous is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = previous
        client = self._mlflow_client
        if self._run_id is not None:
            self._experiment_id = client.get_run(self._run_id).info.experiment_id
        else:
            found = client.get_experiment_by_name(self._experiment_name)
            if found is not None and found.lifecycle_stage != "deleted":
                self._experiment_id = found.experiment_id
            else:
                self._experiment_id = client.create_experiment(name=self._experiment_name,
                                                                    artifact_location=self._artifact_location)
            from mlflow.tracking.context.registry import resolve_tags
            from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME

            tags = dict(self.tags)
            if self._run_name is not None:
                if MLFLOW_RUN_NAME in tags:
                    warnings.warn(f"MLFlowLogger: run_name={self._run_name!r} replaces the tag "
                                  f"{MLFLOW_RUN_NAME}={tags[MLFLOW_RUN_NAME]!r}.")
                tags[MLFLOW_RUN_NAME] = self._run_name
            run = client.create_run(experiment_id=self._experiment_id, tags=resolve_tags(tags),
                                    run_name=self._run_name)
            self._run_id = run.info.run_id
        self._initialized = True
        return client

    @property
    def run_id(self):
        self.experiment
        return self._run_id

    @property
    def experiment_id(self):
        self.experiment
        return self._experiment_id

    @property
    def name(self):
        """The experiment id."""
        return self.experiment_id

    @property
    def version(self):
        """The run id."""
        return self.run_id

    @property
    def save_dir(self):
        """The file store's folder (None when the tracking URI is not a local file store)."""
        if self._tracking_uri.startswith(LOCAL_FILE_URI_PREFIX):
            return self._tracking_uri[len(LOCAL_FILE_URI_PREFIX):]
        return None

    # -- writing -------------------------------------------------------------------------------------------------
    @rank_zero_method
    def log_hyperparams(self, params):
        """Nested dicts are flattened ("opt/lr"); values are stored as text, cut at MLflow's length limit (with a
        warning). MLflow refuses to change a parameter a run already has."""
        from mlflow.entities import Param
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        batch = []
        for key, value in flatten_dict(convert_params(params)).items():
            text = str(value)
            if len(text) > MAX_PARAM_VAL_LENGTH:
                warnings.warn(f"MLFlowLogger: hyper-parameter {key!r} is {len(text)} characters long; MLflow keeps "
                              f"{MAX_PARAM_VAL_LENGTH}, so it is cut there.")
                text = text[:MAX_PARAM_VAL_LENGTH]
            batch.append(Param(key=key, value=text))
        for start in range(0, len(batch), MAX_PARAMS_TAGS_PER_BATCH):
            self.experiment.log_batch(run_id=self.run_id, params=batch[start:start + MAX_PARAMS_TAGS_PER_BATCH],
                                      **self._log_batch_kwargs)

    @rank_zero_method
    def log_metrics(self, metrics, step=None):
        from mlflow.entities import Metric

        timestamp_ms = int(time.time() * 1000)
        batch = []
        for key, value in add_prefix(metrics, self._prefix, self.LOGGER_JOIN_CHAR).items():
            value = scalar(value)
            if isinstance(value, str):
                warnings.warn(f"MLFlowLogger: {key}={value!r} is text, and MLflow metrics are numbers: not logged.")
                continue
            clean = _BAD_METRIC_CHARS.sub("", key)
            if clean != key:  # (Lightning's words and category)
                warnings.warn("MLFlow only allows '_', '/', '.' and ' ' special characters in metric name. Replacing "
                              f"{key} with {clean}.", RuntimeWarning)
            batch.append(Metric(key=clean, value=float(value), timestamp=timestamp_ms, step=step or 0))
        for start in range(0, len(batch), 1000):  # MLflow takes at most 1000 metrics per batch
            self.experiment.log_batch(run_id=self.run_id, metrics=batch[start:start + 1000], **self._log_batch_kwargs)

    # -- checkpoints and the end ---------------------------------------------------------------------------------
    def after_save_checkpoint(self, checkpoint_callback):
        if self._log_model == "all" or (self._log_model is True and checkpoint_callback.save_top_k == -1):
            self._log_checkpoints(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callback = checkpoint_callback

    @rank_zero_method
    def finalize(self, status="success"):
        if not self._initialized:
            return
        if status == "success" and self._checkpoint_callback is not None:
            self._log_checkpoints(self._checkpoint_callback)
        state = {"success": "FINISHED", "finished": "FINISHED", "failed": "FAILED"}.get(status, status)
        self.experiment.set_terminated(self.run_id, state)

    @rank_zero_method
    def _log_checkpoints(self, checkpoint_callback):
        import yaml

        client = self.experiment
        for mtime, path, score, is_best in checkpoints_to_log(checkpoint_callback, self._logged_model_time):
            stem = os.path.splitext(os.path.basename(path))[0]
            artifact_path = f"{self._checkpoint_path_prefix}{stem}"
            if os.path.isdir(path):  # a DeepSpeed checkpoint is a folder
                client.log_artifacts(self._run_id, path, f"{artifact_path}/{os.path.basename(path)}")
            else:
                client.log_artifact(self._run_id, path, artifact_path)
            with tempfile.TemporaryDirectory() as tmp:
                with open(os.path.join(tmp, "metadata.yaml"), "w") as f:
                    yaml.safe_dump(checkpoint_metadata(checkpoint_callback, path, score, "Checkpoint",
                                                       ("_every_n_val_epochs",)), f)
                with open(os.path.join(tmp, "aliases.txt"), "w") as f:
                    f.write(str(["latest", "best"] if is_best else ["latest"]))
                client.log_artifacts(self._run_id, tmp, artifact_path)
            self._logged_model_time[path] = mtime

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_mlflow_client"] = None  # rebuilt in the other process (ddp_spawn)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        from mlflow.tracking import MlflowClient

        allow_file_store(self._tracking_uri)
        self._mlflow_client = MlflowClient(self._tracking_uri)
