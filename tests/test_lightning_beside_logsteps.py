"""The step numbers the loggers get, beside Lightning 2.6 (issue 37): the same tiny module runs under Lightning and
under tasktrain with a logger that records each log_metrics(metrics, step) call, and the (step, keys) sequences are
compared exactly. Lightning's step is fit_loop.epoch_loop._batches_that_stepped (tasktrain:
trainer.state.batches_that_stepped): training batches that stepped, counted after each batch, so
log_every_n_steps=2 writes steps 1, 3, ...; epoch-end values at the last stepped batch's index; evaluation step
values at the evaluation's own batch count. Lightning is a test dependency, imported inside the tests only."""
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain
from tasktrain.callbacks import LearningRateMonitor, ModelCheckpoint
from tasktrain.callbacks.base import Logger as TLogger

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv


class _Record:
    def __init__(self):
        super().__init__()
        self.calls = []

    @property
    def name(self):
        return "record"

    @property
    def version(self):
        return 0

    @property
    def experiment(self):
        return None

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, tuple(sorted(metrics))))

    def log_hyperparams(self, params, *args, **kwargs):
        pass


class LitRecord(_Record, L.loggers.Logger):
    pass


class OurRecord(_Record, TLogger):
    pass


def loader(n, batch_size=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=batch_size)


def module_class(base, manual=False, two_optimizers=False, scheduler=False):
    class Net(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.a = torch.nn.Linear(3, 1)
            self.b = torch.nn.Linear(3, 1)
            self.automatic_optimization = not manual

        def loss(self, batch):
            x, y = batch
            return torch.nn.functional.mse_loss(self.a(x) + self.b(x), y)

        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("loss", loss, on_step=True, on_epoch=True)
            self.log("only_step", loss)
            if not manual:
                return loss
            optimizers = self.optimizers()
            for opt in (optimizers if isinstance(optimizers, list) else [optimizers]):
                opt.zero_grad()
                self.manual_backward(self.loss(batch))
                opt.step()

        def on_train_epoch_end(self):
            self.log("at_epoch_end", float(self.current_epoch))

        def validation_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("val_loss", loss)
            self.log("val_step_loss", loss, on_step=True, on_epoch=True)

        def test_step(self, batch, batch_idx):
            self.log("test_loss", self.loss(batch), on_step=True, on_epoch=True)

        def configure_optimizers(self):
            if two_optimizers:
                return [torch.optim.SGD(self.a.parameters(), lr=0.01), torch.optim.SGD(self.b.parameters(), lr=0.01)]
            optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
            if scheduler:
                return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.9)]
            return optimizer
    return Net


COMMON = dict(enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=1)


def run_lightning(tmp_path, manual=False, two_optimizers=False, scheduler=False, callbacks=(), after=(), ckpt=None,
                  **kwargs):
    logger = LitRecord()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        module = module_class(L.LightningModule, manual, two_optimizers, scheduler)()
        trainer = L.Trainer(default_root_dir=tmp_path / "lit", logger=logger, callbacks=list(callbacks),
                            enable_checkpointing=any(isinstance(c, L.callbacks.ModelCheckpoint) for c in callbacks),
                            accelerator="cpu", **COMMON, **kwargs)
        trainer.fit(module, loader(14), loader(4), ckpt_path=ckpt)
        for stage in after:
            getattr(trainer, stage)(module, loader(4), verbose=False)
    return logger.calls, trainer


def run_ours(tmp_path, manual=False, two_optimizers=False, scheduler=False, callbacks=(), after=(), ckpt=None,
             **kwargs):
    logger = OurRecord()
    module = module_class(tasktrain.TaskModule, manual, two_optimizers, scheduler)()
    trainer = tasktrain.Trainer(default_root_dir=tmp_path / "ours", logger=logger, callbacks=list(callbacks),
                                enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
                                **COMMON, **kwargs)
    trainer.fit(module, loader(14), loader(4), ckpt_path=ckpt)
    for stage in after:
        getattr(trainer, stage)(module, loader(4), verbose=False)
    return logger.calls, trainer


def test_automatic_accumulation_validation_and_evaluation_after_fit(tmp_path):
    # 7 batches an epoch in windows of 2 (the last one cut short): 4 stepping batches; validation after batch 2 (a
    # window's middle) and 5 and at the epoch's end; the learning rate at the log steps; validate and test after fit
    args = dict(max_epochs=2, log_every_n_steps=2, accumulate_grad_batches=2, val_check_interval=3,
                after=("validate", "test"), scheduler=True)
    lit, _ = run_lightning(tmp_path, callbacks=[L.callbacks.LearningRateMonitor("step")], **args)
    ours, trainer = run_ours(tmp_path, callbacks=[LearningRateMonitor("step")], **args)
    assert ours == lit
    assert trainer.state.batches_that_stepped == 8 and trainer.global_step == 8
    steps = [s for s, keys in ours if "loss_step" in keys]
    assert steps == [1, 3, 5, 7]  # (global_step would be 2, 4, 6, 8)
    assert [s for s, keys in ours if "loss_epoch" in keys] == [3, 7]  # the last stepped batch's index


def test_log_every_step_with_validation_each_batch(tmp_path):
    args = dict(max_epochs=1, log_every_n_steps=1, val_check_interval=2, limit_val_batches=1, after=("validate",))
    lit, _ = run_lightning(tmp_path, **args)
    ours, _ = run_ours(tmp_path, **args)
    assert ours == lit
    assert [s for s, keys in ours if "loss_step" in keys] == list(range(7))


@pytest.mark.parametrize("two_optimizers", [False, True])
def test_manual_optimization_counts_batches(tmp_path, two_optimizers):
    args = dict(max_epochs=1, log_every_n_steps=3, manual=True, two_optimizers=two_optimizers, after=("test",))
    lit, _ = run_lightning(tmp_path, **args)
    ours, trainer = run_ours(tmp_path, **args)
    assert ours == lit
    assert trainer.state.batches_that_stepped == 7  # once per batch, whatever the optimizer steps
    assert trainer.global_step == (14 if two_optimizers else 7)


def test_resume_from_a_mid_epoch_checkpoint(tmp_path):
    # a checkpoint every 3 optimizer steps, saved in on_train_batch_end; the fit resumes from the one at step 3
    # (batch 5 of the first epoch's 7, before that batch was counted) and goes on to the end: Lightning's steps
    args = dict(max_epochs=2, log_every_n_steps=2, accumulate_grad_batches=2, val_check_interval=3)
    lit_ckpt = L.callbacks.ModelCheckpoint(dirpath=tmp_path / "lit_ckpt", every_n_train_steps=3, save_top_k=-1)
    run_lightning(tmp_path, callbacks=[lit_ckpt], **args)
    our_ckpt = ModelCheckpoint(dirpath=tmp_path / "our_ckpt", every_n_train_steps=3, save_top_k=-1)
    run_ours(tmp_path, callbacks=[our_ckpt], **args)
    lit, _ = run_lightning(tmp_path, ckpt=str(tmp_path / "lit_ckpt" / "epoch=0-step=3.ckpt"), **args)
    saved = torch.load(tmp_path / "our_ckpt" / "epoch=0-step=3.ckpt", weights_only=False)
    assert saved["loops"]["train_state"]["batches_that_stepped"] == 3  # the batch it was saved in is counted
    ours, trainer = run_ours(tmp_path, ckpt=str(tmp_path / "our_ckpt" / "epoch=0-step=3.ckpt"), **args)
    assert ours == lit
    assert trainer.state.batches_that_stepped == 8


def test_checkpoint_without_the_counter_resumes_at_global_step(tmp_path):
    ckpt = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    run_ours(tmp_path, callbacks=[ckpt], max_epochs=1, log_every_n_steps=2)
    path = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    saved = torch.load(path, weights_only=False)
    assert saved["loops"]["train_state"].pop("batches_that_stepped") == 3
    torch.save(saved, path)  # a checkpoint written before the counter existed
    ours, trainer = run_ours(tmp_path, ckpt=str(path), max_epochs=1, log_every_n_steps=2)
    assert trainer.state.batches_that_stepped == 7
    assert [s for s, keys in ours if "loss_step" in keys] == [3, 5]


def test_log_every_n_steps_zero_writes_no_step_values(tmp_path):
    # Lightning accepts 0 (barebones sets it): no step values, no step-interval learning rate; epoch values stay
    args = dict(max_epochs=1, log_every_n_steps=0, val_check_interval=3)
    lit, _ = run_lightning(tmp_path, callbacks=[L.callbacks.LearningRateMonitor("step")], **args)
    ours, _ = run_ours(tmp_path, callbacks=[LearningRateMonitor("step")], **args)
    assert ours == lit
    assert not [keys for _, keys in ours if "loss_step" in keys or "lr-SGD" in keys]
    assert [s for s, keys in ours if "loss_epoch" in keys] == [6]
    with pytest.raises(ValueError, match="log_every_n_steps=-1"):
        tasktrain.Trainer(log_every_n_steps=-1)


def test_a_logged_step_value_is_the_step(tmp_path):
    def fit(base, trainer_class, logger, **extra):
        class StepLogging(module_class(base)):
            def training_step(self, batch, batch_idx):
                loss = self.loss(batch)
                self.log("loss", loss)
                self.log("step", float(100 + batch_idx))  # taken out of the values and used as the step
                return loss

        trainer_class(logger=logger, max_epochs=1, log_every_n_steps=2, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, **extra).fit(StepLogging(), loader(8))
        return logger.calls

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lit = fit(L.LightningModule, L.Trainer, LitRecord(), default_root_dir=tmp_path / "lit", accelerator="cpu")
    ours = fit(tasktrain.TaskModule, tasktrain.Trainer, OurRecord(), default_root_dir=tmp_path / "ours")
    assert ours == lit == [(101, ("loss",)), (103, ("loss",)), (3, ("at_epoch_end", "epoch"))]


def test_a_step_value_logged_once_is_written_again_until_its_epoch_ends(tmp_path):
    # Lightning writes the latest value of every step metric of the epoch at each write; with two validation
    # loaders each writes its own values (and values logged without a suffix)
    def fit(base, trainer_class, logger, **extra):
        class Sometimes(module_class(base)):
            def training_step(self, batch, batch_idx):
                if batch_idx == 0:
                    self.log("first_batch", 1.0)
                return super().training_step(batch, batch_idx)

            def validation_step(self, batch, batch_idx, dataloader_idx=0):
                if batch_idx == 0:
                    self.log("val_first", 1.0, on_step=True, on_epoch=False)
                self.log("val_every", self.loss(batch), on_step=True)

        trainer_class(logger=logger, max_epochs=2, log_every_n_steps=2, num_sanity_val_steps=0,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      **extra).fit(Sometimes(), loader(10), [loader(4), loader(4, seed=1)])
        return logger.calls

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lit = fit(L.LightningModule, L.Trainer, LitRecord(), default_root_dir=tmp_path / "lit", accelerator="cpu")
    ours = fit(tasktrain.TaskModule, tasktrain.Trainer, OurRecord(), default_root_dir=tmp_path / "ours")
    assert ours == lit
    assert [s for s, keys in ours if "first_batch" in keys] == [1, 3, 5, 7, 9]  # each write, not the first only
    assert [s for s, keys in ours if "val_first/dataloader_idx_1" in keys] == [0, 1, 2, 3]


def test_validation_inside_the_epoch_comes_after_the_batch_end_and_its_step_write(tmp_path):
    # Lightning's on_advance_end: on_train_batch_end, the step values written, then the validation; EarlyStopping
    # checks at that validation's end (val_check_interval=2: Lightning's default checks at each validation)
    def fit(callback_base, trainer_class, base, logger, stopper, **extra):
        class Hooks(callback_base):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                logger.calls.append(("on_train_batch_end", batch_idx))

            def on_validation_start(self, trainer, module):
                logger.calls.append(("on_validation_start", trainer.global_step))

        class Declining(module_class(base)):
            def on_validation_epoch_end(self):
                self.log("score", float(self.global_step))  # rises: patience 1 stops at the 2nd validation

        trainer = trainer_class(logger=logger, callbacks=[Hooks(), stopper], max_epochs=1, log_every_n_steps=1,
                                val_check_interval=2, limit_val_batches=1, num_sanity_val_steps=0,
                                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                                **extra)
        trainer.fit(Declining(), loader(14), loader(4))
        return logger.calls, trainer.global_step

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lit = fit(L.Callback, L.Trainer, L.LightningModule, LitRecord(), L.callbacks.EarlyStopping("score", patience=1),
                  default_root_dir=tmp_path / "lit", accelerator="cpu")
    from tasktrain.callbacks import Callback, EarlyStopping

    ours = fit(Callback, tasktrain.Trainer, tasktrain.TaskModule, OurRecord(), EarlyStopping("score", patience=1),
               default_root_dir=tmp_path / "ours")
    assert ours == lit
    assert lit[1] == 4 and lit[0][:4] == [("on_train_batch_end", 0), (0, ("epoch", "loss_step", "only_step")),
                                          ("on_train_batch_end", 1), (1, ("epoch", "loss_step", "only_step"))]


def test_a_reload_of_the_validation_loaders_starts_their_step_count_again(tmp_path):
    # reload_dataloaders_every_n_epochs=3 with validation every 2nd epoch (1, 3, 5): Lightning sets the validation
    # loaders up again at a validation 3 epochs or more after the last set-up (epochs 1 and 5, given loaders too), and
    # each set-up restarts the step of the validation's on_step values
    args = dict(max_epochs=6, limit_train_batches=2, check_val_every_n_epoch=2, reload_dataloaders_every_n_epochs=3)
    lit, _ = run_lightning(tmp_path, **args)
    ours, _ = run_ours(tmp_path, **args)
    assert ours == lit
    assert [s for s, keys in ours if "val_step_loss_step" in keys] == [0, 1, 2, 3, 0, 1]


class _Saves(_Record):
    """Records each write and each save(), in order."""

    def log_metrics(self, metrics, step=None):
        self.calls.append(("write", step, tuple(sorted(metrics))))

    def save(self):
        self.calls.append(("save",))


class LitSaves(_Saves, L.loggers.Logger):
    pass


class OurSaves(_Saves, TLogger):
    pass


def test_save_follows_each_write_of_the_trainer_and_a_stop(tmp_path):
    # Lightning's logger connector saves after each of its writes (not after LearningRateMonitor's own), the
    # hyper-parameters' write at fit start ends with one, a batch at which a stop was asked ends with one, finalize
    # saves; with and without validation (Lightning validates once more at a batch where a stop was asked)
    def fit(callback_base, trainer_class, base, logger, monitor, val, **extra):
        class StopAt(callback_base):
            def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
                if trainer.current_epoch == 1 and batch_idx == 3:
                    trainer.should_stop = True

        trainer = trainer_class(logger=logger, callbacks=[StopAt(), monitor], max_epochs=2, log_every_n_steps=2,
                                val_check_interval=3, limit_val_batches=1, num_sanity_val_steps=0,
                                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                                **extra)
        trainer.fit(module_class(base)(), loader(14), loader(4) if val else None)
        return logger.calls

    seen = {}
    for val in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lit = fit(L.Callback, L.Trainer, L.LightningModule, LitSaves(), L.callbacks.LearningRateMonitor("step"),
                      val, default_root_dir=tmp_path / "lit", accelerator="cpu")
        from tasktrain.callbacks import Callback

        ours = fit(Callback, tasktrain.Trainer, tasktrain.TaskModule, OurSaves(), LearningRateMonitor("step"), val,
                   default_root_dir=tmp_path / "ours")
        assert ours == lit
        seen[val] = lit
    trainer_writes = [c for c in seen[True] if c[0] == "write" and c[2] != ("lr-SGD",)]
    assert seen[True][0] == ("save",) and seen[True].count(("save",)) == 1 + len(trainer_writes) + 1 + 1
    # the stop: the batch's write, its save, the stop's save, the epoch values, their save, finalize's save
    assert [c[0] for c in seen[False][-6:]] == ["write", "save", "save", "write", "save", "save"]


def _tree(root):
    """The folders and files under root, relative; event files by their kind (their names hold a host and a time),
    hidden files left out (tasktrain's resume pointer, .last_checkpoint.json: docs/lightning.md)."""
    found = []
    for folder, dirs, files in os.walk(root):
        rel = os.path.relpath(folder, root)
        found += [os.path.join(rel, d) + "/" for d in dirs]
        found += [os.path.join(rel, "events.out.tfevents" if f.startswith("events.out.tfevents") else f)
                  for f in files if not f.startswith(".")]
    return sorted(found)


@pytest.mark.parametrize("logger", ["default", "csv", "tensorboard"])
def test_the_logs_folder_is_lightnings(tmp_path, logger):
    def fit(trainer_class, base, loggers, root):
        made = {"default": True, "csv": lambda: loggers.CSVLogger(root),
                "tensorboard": lambda: loggers.TensorBoardLogger(root)}[logger]
        trainer = trainer_class(default_root_dir=root, logger=made if made is True else made(), max_steps=1,
                                enable_progress_bar=False, enable_model_summary=False)
        trainer.fit(module_class(base)(), loader(2))
        return (os.path.relpath(trainer.log_dir, root), os.path.relpath(trainer.checkpoint_callback.dirpath, root),
                _tree(root))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lit = fit(lambda **kw: L.Trainer(accelerator="cpu", **kw), L.LightningModule, L.loggers, tmp_path / "lit")
    ours = fit(tasktrain.Trainer, tasktrain.TaskModule, tasktrain.loggers, tmp_path / "ours")
    assert ours == lit
    assert lit[0] == os.path.join("lightning_logs", "version_0")
    assert lit[1] == os.path.join("lightning_logs", "version_0", "checkpoints")


def test_a_step_logged_at_an_epoch_end_is_the_step(tmp_path):
    # Lightning's test_adding_step_key: a "step" value logged in on_train_epoch_end / on_validation_epoch_end is the
    # step of that write (and no "epoch" is added)
    def fit(base, trainer_class, logger, **extra):
        class EpochStep(module_class(base)):
            def on_train_epoch_end(self):
                self.log_dict({"step": float(50 + self.current_epoch), "train_acc": 0.5})

            def on_validation_epoch_end(self):
                self.log_dict({"step": float(90 + self.current_epoch), "val_acc": 0.25})

        trainer_class(logger=logger, max_epochs=2, log_every_n_steps=50, limit_val_batches=1, num_sanity_val_steps=0,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                      **extra).fit(EpochStep(), loader(4), loader(4))
        return logger.calls

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lit = fit(L.LightningModule, L.Trainer, LitRecord(), default_root_dir=tmp_path / "lit", accelerator="cpu")
    ours = fit(tasktrain.TaskModule, tasktrain.Trainer, OurRecord(), default_root_dir=tmp_path / "ours")
    assert ours == lit
    assert [(s, "epoch" in keys) for s, keys in lit if "val_acc" in keys] == [(90, False), (91, False)]
    assert [s for s, keys in lit if "train_acc" in keys] == [50, 51]
