"""ModelCheckpoint: save at step or epoch intervals, keep the top k by a monitored metric, keep `last.ckpt`."""
import os
import re

import torch

from tasktrain.callbacks.base import Callback

_FIELD = re.compile(r"\{([A-Za-z_][A-Za-z0-9_/.\-]*)(:[^}]*)?\}")


class ModelCheckpoint(Callback):
    CHECKPOINT_EXT = ".ckpt"
    LAST_NAME = "last"

    def __init__(self, dirpath=None, filename=None, monitor=None, mode="min", save_top_k=1, save_last=False,
                 every_n_train_steps=None, every_n_epochs=None, save_weights_only=False):
        if mode not in ("min", "max"):
            raise ValueError(f"ModelCheckpoint(mode={mode!r}): use 'min' or 'max'.")
        if save_top_k < -1:
            raise ValueError(f"ModelCheckpoint(save_top_k={save_top_k}): use -1 (all), 0 (none) or a positive k.")
        if every_n_train_steps is not None and every_n_epochs is not None:
            raise ValueError("ModelCheckpoint: give every_n_train_steps or every_n_epochs, not both.")
        self.dirpath = os.fspath(dirpath) if dirpath is not None else None
        self.filename = filename
        self.monitor = monitor
        self.mode = mode
        self.save_top_k = save_top_k
        self.save_last = save_last
        self.every_n_train_steps = every_n_train_steps
        self.every_n_epochs = 1 if every_n_epochs is None and every_n_train_steps is None else every_n_epochs
        self.save_weights_only = save_weights_only
        self.best_k_models = {}  # path -> score
        self.best_model_path = ""
        self.best_model_score = None
        self.last_model_path = ""
        self._last_saved_step = -1
        self._validated = False
        self._resolved_dir = None

    @property
    def state_key(self):
        return self._generate_state_key(monitor=self.monitor, mode=self.mode,
                                        every_n_train_steps=self.every_n_train_steps, every_n_epochs=self.every_n_epochs)

    def dirpath_resolved(self, trainer):
        if self._resolved_dir is None:
            directory = self.dirpath or os.path.join(trainer.log_dir, "checkpoints")
            self._resolved_dir = trainer.strategy.broadcast(directory)
        return self._resolved_dir

    # -- events --------------------------------------------------------------------------------------------------
    def setup(self, trainer, module, stage):
        self._resolved_dir = None
        if stage == "fit":
            self.dirpath_resolved(trainer)
        self._validated = False

    def on_validation_end(self, trainer, module):
        if not trainer.sanity_checking and trainer.training:
            self._validated = True

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        step = trainer.global_step
        due = self.every_n_train_steps and step % self.every_n_train_steps == 0
        # After a validation inside the epoch (val_check_interval), save with the fresh metrics.
        after_val = self._validated and self.every_n_epochs and trainer.state.batch_in_epoch != trainer.num_training_batches
        if (due or after_val) and step != self._last_saved_step:
            self._save(trainer)
        if after_val:
            self._validated = False

    def on_train_epoch_end(self, trainer, module):
        n = self.every_n_epochs
        if n and (trainer.current_epoch + 1) % n == 0:
            self._save(trainer)
        self._validated = False

    # -- saving --------------------------------------------------------------------------------------------------
    def _save(self, trainer):
        metrics = trainer.callback_metrics
        score = None
        if self.monitor is not None:
            if self.monitor not in metrics:
                if trainer._val_loader is not None and not self._any_validation(trainer):
                    return  # the metric comes from validation, which has not run yet in this fit
                raise KeyError(
                    f"ModelCheckpoint(monitor={self.monitor!r}): no such metric was logged. Logged metrics: "
                    f"{sorted(metrics) or 'none'}. Log it with self.log({self.monitor!r}, ...) or change monitor."
                )
            score = metrics[self.monitor]
            score = float(score) if isinstance(score, torch.Tensor) else float(score)
        directory = self.dirpath_resolved(trainer)
        path = os.path.join(directory, self.format_checkpoint_name(trainer, metrics) + self.CHECKPOINT_EXT)
        self._last_saved_step = trainer.global_step
        saved = False
        if self.save_top_k != 0 and self._is_top_k(score, path):
            trainer.save_checkpoint(path, weights_only=self.save_weights_only)
            saved = True
            self._update_top_k(trainer, path, score)
        if self.save_last:
            last = os.path.join(directory, self.LAST_NAME + self.CHECKPOINT_EXT)
            if saved and trainer.is_global_zero:
                _atomic_link(path, last)
            elif not saved:
                trainer.save_checkpoint(last, weights_only=self.save_weights_only)
            trainer.strategy.barrier("last")
            if saved and not self.save_weights_only and trainer.is_global_zero:
                from tasktrain.trainer.checkpoint import write_last_pointer

                write_last_pointer(trainer.default_root_dir, last, trainer.global_step, trainer.current_epoch)
            self.last_model_path = last

    def _any_validation(self, trainer):
        return getattr(trainer, "_validations_run", 0) > 0

    def _is_top_k(self, score, path):
        if self.save_top_k == -1 or score is None or path in self.best_k_models:
            return True
        if len(self.best_k_models) < self.save_top_k:
            return True
        worst = self._worst()
        return score < self.best_k_models[worst] if self.mode == "min" else score > self.best_k_models[worst]

    def _worst(self):
        pick = max if self.mode == "min" else min
        return pick(self.best_k_models, key=self.best_k_models.get)

    def _update_top_k(self, trainer, path, score):
        if score is None:
            # No monitor: keep the newest save_top_k files.
            self.best_k_models[path] = float(trainer.global_step)
            while self.save_top_k != -1 and len(self.best_k_models) > self.save_top_k:
                oldest = min(self.best_k_models, key=self.best_k_models.get)
                self._remove(trainer, oldest)
            self.best_model_path = path
            return
        self.best_k_models[path] = score
        while self.save_top_k != -1 and len(self.best_k_models) > self.save_top_k:
            self._remove(trainer, self._worst())  # only after the new file is on disk
        pick = min if self.mode == "min" else max
        self.best_model_path = pick(self.best_k_models, key=self.best_k_models.get)
        self.best_model_score = torch.tensor(self.best_k_models[self.best_model_path])

    def _remove(self, trainer, path):
        del self.best_k_models[path]
        trainer.strategy.remove_checkpoint(path)

    def format_checkpoint_name(self, trainer, metrics):
        template = self.filename or "{epoch}-{step}"
        values = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        for k, v in metrics.items():
            values[k] = float(v) if isinstance(v, torch.Tensor) else v

        def fill(match):
            name, fmt = match.group(1), match.group(2) or ""
            if name not in values:
                raise KeyError(f"ModelCheckpoint filename {template!r} uses {{{name}}}, which was not logged. Logged "
                               f"metrics: {sorted(metrics)}.")
            return f"{name}=" + format(values[name], fmt[1:] if fmt else "")

        return _FIELD.sub(fill, template).replace("/", "_")

    # -- state -----------------------------------------------------------------------------------------------------
    def state_dict(self):
        return {
            "best_k_models": dict(self.best_k_models),
            "best_model_path": self.best_model_path,
            "best_model_score": None if self.best_model_score is None else float(self.best_model_score),
            "last_model_path": self.last_model_path,
            "dirpath": self._resolved_dir or self.dirpath,
            "last_saved_step": self._last_saved_step,
        }

    def load_state_dict(self, state):
        self.best_k_models = dict(state.get("best_k_models", {}))
        self.best_model_path = state.get("best_model_path", "")
        score = state.get("best_model_score")
        self.best_model_score = None if score is None else torch.tensor(score)
        self.last_model_path = state.get("last_model_path", "")
        self._last_saved_step = state.get("last_saved_step", -1)
        if self.dirpath is None and state.get("dirpath"):
            # keep writing where the interrupted run wrote, so top-k keeps covering its files
            self.dirpath = state["dirpath"]
            self._resolved_dir = None


def _atomic_link(src, dst):
    tmp = f"{dst}.tmp-{os.getpid()}"
    if os.path.exists(tmp):
        os.remove(tmp)
    try:
        os.link(src, tmp)
    except OSError:
        import shutil

        shutil.copyfile(src, tmp)
    os.replace(tmp, dst)
