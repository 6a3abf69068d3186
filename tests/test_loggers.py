"""Loggers read back from disk: TensorBoard event files (with TensorBoard's own reader), metrics.csv and
hparams.yaml; the Trainer's logger argument; LearningRateMonitor against the scheduler."""
import csv
import os

import pytest
import torch
import yaml
from helpers import Linear, loader

from tasktrain import CSVLogger, LearningRateMonitor, TensorBoardLogger, Trainer


def fit(module, epochs=2, n=32, val=None, **kwargs):
    kwargs = {"enable_progress_bar": False, "enable_checkpointing": False, "num_sanity_val_steps": 0, **kwargs}
    trainer = Trainer(max_epochs=epochs, **kwargs)
    trainer.fit(module, loader(n), val)
    return trainer


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def scalars(log_dir, tag):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(log_dir), size_guidance={"scalars": 0}).Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)], acc


class Squares(Linear):
    """Logs (number of the step being taken)^2 at every step, and the loss per step and per epoch."""

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.log("square", float(self.global_step + 1) ** 2)
        self.log("loss", loss, on_step=True, on_epoch=True)
        return loss


def test_tensorboard_event_files_hold_the_logged_scalars_and_hparams(tmp_path):
    logger = TensorBoardLogger(tmp_path)
    trainer = fit(Squares(lr=0.05), n=48, val=loader(16), logger=logger, log_every_n_steps=4)  # 6 steps an epoch
    assert trainer.log_dir == logger.log_dir == str(tmp_path / "tasktrain_logs" / "version_0")
    points, acc = scalars(trainer.log_dir, "square")
    assert points == [(4, 16.0), (8, 64.0), (12, 144.0)]  # steps are the multiples of log_every_n_steps
    assert [s for s, _ in scalars(trainer.log_dir, "loss_step")[0]] == [4, 8, 12]
    # epoch metrics once per epoch, at the epoch's last step
    epoch_loss = scalars(trainer.log_dir, "loss_epoch")[0]
    assert [s for s, _ in epoch_loss] == [6, 12]
    assert epoch_loss[-1][1] == pytest.approx(float(trainer.callback_metrics["loss_epoch"]))
    val = scalars(trainer.log_dir, "val_loss")[0]
    assert [s for s, _ in val] == [6, 12] and val[-1][1] == pytest.approx(float(trainer.callback_metrics["val_loss"]))
    assert scalars(trainer.log_dir, "epoch")[0][-1] == (12, 1.0)

    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["lr"].number_value == pytest.approx(0.05)
    with open(os.path.join(trainer.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"lr": 0.05}

    # the next run gets the next version
    trainer = fit(Squares(), epochs=1, logger=TensorBoardLogger(tmp_path))
    assert trainer.log_dir == str(tmp_path / "tasktrain_logs" / "version_1")


def test_logger_argument_forms(tmp_path):
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, enable_progress_bar=False)  # logger=True: TensorBoard
    assert [type(lg) for lg in trainer.loggers] == [TensorBoardLogger]
    trainer.fit(Squares(), loader(16))
    assert trainer.log_dir == str(tmp_path / "tasktrain_logs" / "version_0")
    points, acc = scalars(trainer.log_dir, "loss_epoch")
    assert points[0][0] == 2 and "square" not in acc.Tags()["scalars"]  # 2 steps < log_every_n_steps=50

    root = tmp_path / "none"
    trainer = fit(Squares(), logger=False, default_root_dir=root)
    assert trainer.loggers == [] and trainer.log_dir == str(root) and not root.exists()

    both = [TensorBoardLogger(tmp_path / "many"), CSVLogger(tmp_path / "many", name="csv")]
    trainer = fit(Squares(), logger=both, log_every_n_steps=2)
    assert trainer.loggers == both and trainer.logger is both[0]
    assert [int(r["step"]) for r in read_csv(both[1].metrics_file_path) if r["square"]] == [2, 4, 6, 8]
    assert [s for s, _ in scalars(both[0].log_dir, "square")[0]] == [2, 4, 6, 8]

    with pytest.raises(TypeError, match="logger="):
        Trainer(logger="tensorboard")


def test_csv_logger_rows_new_columns_and_buffering(tmp_path):
    seen_on_disk = []

    class M(Linear):
        def training_step(self, batch, batch_idx):
            loss = super().training_step(batch, batch_idx)
            self.log("a", float(self.global_step + 1), logger=True)
            if self.current_epoch == 1:  # a column that appears after the file was written
                self.log("late", 10.0 * (self.global_step + 1))
            if self.global_step == 0:  # logged once: written once, not repeated at later log steps
                self.log("once", 7.0)
            return loss

        def on_train_epoch_start(self):
            path = self.trainer.logger.metrics_file_path
            seen_on_disk.append(read_csv(path) if os.path.exists(path) else None)

    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=2)
    trainer = fit(M(), logger=logger, log_every_n_steps=2)
    assert logger.metrics_file_path == os.path.join(trainer.log_dir, "metrics.csv")
    assert seen_on_disk[0] is None and [r["step"] for r in seen_on_disk[1]] == ["2", "4"]
    with open(logger.metrics_file_path) as f:
        assert f.readline().strip() == "step,a,once,train_loss,epoch,late"
    rows = read_csv(logger.metrics_file_path)
    assert [(r["step"], r["a"], r["epoch"], r["late"], r["once"]) for r in rows] == [
        ("2", "2.0", "0.0", "", "7.0"), ("4", "4.0", "0.0", "", ""), ("6", "6.0", "1.0", "60.0", ""),
        ("8", "8.0", "1.0", "80.0", "")]
    assert float(rows[-1]["train_loss"]) == pytest.approx(float(trainer.callback_metrics["train_loss"]))
    with open(os.path.join(trainer.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"lr": 0.1}

    # buffered: nothing on disk until the run ends when the flush interval is longer than the run
    seen_on_disk.clear()
    logger = CSVLogger(tmp_path, name="buffered")
    fit(M(), logger=logger, log_every_n_steps=2)
    assert seen_on_disk == [None, None] and len(read_csv(logger.metrics_file_path)) == 4


def test_csv_logger_one_row_per_step_and_epoch_values(tmp_path):
    logger = CSVLogger(tmp_path, version="run")
    trainer = fit(Squares(), logger=logger, log_every_n_steps=4, val=loader(8))
    assert trainer.log_dir == str(tmp_path / "tasktrain_logs" / "run")
    rows = read_csv(logger.metrics_file_path)
    # step values, epoch values and validation of the same step share a row
    assert [(r["step"], r["square"], bool(r["loss_epoch"]), bool(r["val_loss"])) for r in rows] == [
        ("4", "16.0", True, True), ("8", "64.0", True, True)]


def test_metric_names_ending_in_step_or_epoch(tmp_path):
    class M(Linear):
        def training_step(self, batch, batch_idx):
            self.log("acc_epoch", 0.5, on_step=False, on_epoch=True)  # its own name, not the epoch value of "acc"
            self.log("warm_step", 2.0)
            return super().training_step(batch, batch_idx)

    logger = CSVLogger(tmp_path)
    fit(M(), epochs=1, logger=logger, log_every_n_steps=2)
    rows = read_csv(logger.metrics_file_path)
    assert [(r["step"], r["warm_step"], r["acc_epoch"]) for r in rows] == [("2", "2.0", ""), ("4", "2.0", "0.5")]


def test_loggers_write_on_rank_zero_only(tmp_path, monkeypatch):
    monkeypatch.setattr(Trainer, "is_global_zero", property(lambda self: False))
    logger = CSVLogger(tmp_path)
    fit(Squares(), logger=[logger, TensorBoardLogger(tmp_path, name="tb")], log_every_n_steps=1)
    assert list(tmp_path.iterdir()) == []


# -- LearningRateMonitor ------------------------------------------------------------------------------------------
class TwoGroups(Linear):
    def configure_optimizers(self):
        opt = torch.optim.SGD([{"params": [self.layer.weight]}, {"params": [self.layer.bias], "lr": 0.01}], lr=0.1)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (s + 1))
        self.sched = sched
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def test_lr_monitor_per_step_and_param_group_matches_the_scheduler(tmp_path):
    from_scheduler = {}

    class M(TwoGroups):
        def on_train_batch_end(self, outputs, batch, batch_idx):
            from_scheduler[self.global_step] = self.sched.get_last_lr()

    logger = CSVLogger(tmp_path)
    fit(M(), callbacks=[LearningRateMonitor("step")], logger=logger, log_every_n_steps=2,
        accumulate_grad_batches=2, n=64)  # 4 optimizer steps an epoch
    rows = [r for r in read_csv(logger.metrics_file_path) if r["lr-SGD/pg1"]]
    assert [int(r["step"]) for r in rows] == [2, 4, 6, 8]  # once per log step, not per micro-batch
    for r in rows:
        step = int(r["step"])
        assert float(r["lr-SGD/pg1"]) == pytest.approx(0.1 / (step + 1))  # after `step` scheduler updates
        assert float(r["lr-SGD/pg2"]) == pytest.approx(0.01 / (step + 1))
        assert [float(r["lr-SGD/pg1"]), float(r["lr-SGD/pg2"])] == pytest.approx(from_scheduler[step])


def test_lr_monitor_per_epoch_follows_the_scheduler_interval(tmp_path):
    class M(Linear):
        def configure_optimizers(self):
            opt = torch.optim.Adam(self.parameters(), lr=0.1)
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)}

    logger = CSVLogger(tmp_path)
    fit(M(), epochs=3, callbacks=[LearningRateMonitor()], logger=logger, log_every_n_steps=1)  # None: "epoch"
    rows = [(int(r["step"]), float(r["lr-Adam"])) for r in read_csv(logger.metrics_file_path) if r["lr-Adam"]]
    assert rows == [(0, 0.1), (4, 0.05), (8, 0.025)]  # at each epoch start, the rate that epoch trains with


def test_lr_monitor_names_several_optimizers_and_needs_a_logger(tmp_path):
    class M(Linear):
        automatic_optimization = False

        def __init__(self):
            super().__init__()
            self.other = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            opt = self.optimizers()[0]
            loss = super().training_step(batch, batch_idx)
            opt.zero_grad()
            self.manual_backward(loss)
            opt.step()

        def configure_optimizers(self):
            a = torch.optim.AdamW(self.layer.parameters(), lr=0.1)
            b = torch.optim.AdamW(self.other.parameters(), lr=0.2)
            c = torch.optim.AdamW(self.other.parameters(), lr=0.3)
            named = {"scheduler": torch.optim.lr_scheduler.StepLR(a, 1), "name": "gen"}
            return [{"optimizer": a, "lr_scheduler": named}, {"optimizer": b}, {"optimizer": c}]

    logger = CSVLogger(tmp_path)
    fit(M(), epochs=1, callbacks=[LearningRateMonitor("epoch")], logger=logger)
    row = read_csv(logger.metrics_file_path)[0]
    assert (row["gen"], row["lr-AdamW"], row["lr-AdamW-1"]) == ("0.1", "0.2", "0.3")
    trainer = Trainer(max_epochs=1, callbacks=[LearningRateMonitor()], logger=False, enable_progress_bar=False)
    with pytest.raises(ValueError, match="LearningRateMonitor.*logger=False"):
        trainer.fit(Linear(), loader(8))
    with pytest.raises(ValueError, match="logging_interval"):
        LearningRateMonitor("batch")
