"""Loggers read back from disk: TensorBoard event files (with TensorBoard's own reader), metrics.csv and
hparams.yaml; the Trainer's logger argument; LearningRateMonitor against the scheduler."""
import csv
import os

import pytest
import torch
import yaml
from helpers import Linear, loader

from tasktrain import CSVLogger, LearningRateMonitor, TensorBoardLogger, Trainer
from tasktrain.loggers.csv_logs import ExperimentWriter


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
    assert trainer.log_dir == logger.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    points, acc = scalars(trainer.log_dir, "square")
    # Lightning's step (batches_that_stepped): the batches counted before the log step's batch, so the 4th, 8th and
    # 12th optimizer steps are written at 3, 7, 11
    assert points == [(3, 16.0), (7, 64.0), (11, 144.0)]
    assert [s for s, _ in scalars(trainer.log_dir, "loss_step")[0]] == [3, 7, 11]
    # epoch metrics once per epoch, at the epoch's last stepped batch (its index in the count)
    epoch_loss = scalars(trainer.log_dir, "loss_epoch")[0]
    assert [s for s, _ in epoch_loss] == [5, 11]
    assert epoch_loss[-1][1] == pytest.approx(float(trainer.callback_metrics["loss_epoch"]))
    val = scalars(trainer.log_dir, "val_loss")[0]
    assert [s for s, _ in val] == [5, 11] and val[-1][1] == pytest.approx(float(trainer.callback_metrics["val_loss"]))
    assert scalars(trainer.log_dir, "epoch")[0][-1] == (11, 1.0)

    from tensorboard.plugins.hparams import plugin_data_pb2

    content = acc.SummaryMetadata("_hparams_/session_start_info").plugin_data.content
    hparams = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info.hparams
    assert hparams["lr"].number_value == pytest.approx(0.05)
    with open(os.path.join(trainer.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"lr": 0.05}

    # the next run gets the next version
    trainer = fit(Squares(), epochs=1, logger=TensorBoardLogger(tmp_path))
    assert trainer.log_dir == str(tmp_path / "lightning_logs" / "version_1")


def test_logger_argument_forms(tmp_path):
    trainer = Trainer(max_epochs=1, default_root_dir=tmp_path, enable_progress_bar=False)  # logger=True: TensorBoard
    assert [type(lg) for lg in trainer.loggers] == [TensorBoardLogger]
    trainer.fit(Squares(), loader(16))
    assert trainer.log_dir == str(tmp_path / "lightning_logs" / "version_0")
    points, acc = scalars(trainer.log_dir, "loss_epoch")
    assert points[0][0] == 1 and "square" not in acc.Tags()["scalars"]  # 2 steps < log_every_n_steps=50

    root = tmp_path / "none"
    trainer = fit(Squares(), logger=False, default_root_dir=root)
    assert trainer.loggers == [] and trainer.log_dir == str(root) and not root.exists()

    both = [TensorBoardLogger(tmp_path / "many"), CSVLogger(tmp_path / "many", name="csv")]
    trainer = fit(Squares(), logger=both, log_every_n_steps=2)
    assert trainer.loggers == both and trainer.logger is both[0]
    assert [int(r["step"]) for r in read_csv(both[1].metrics_file_path) if r["square"]] == [1, 3, 5, 7]
    assert [s for s, _ in scalars(both[0].log_dir, "square")[0]] == [1, 3, 5, 7]

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
            if self.global_step == 0:  # logged once: written at each later write of its epoch (Lightning's)
                self.log("once", 7.0)
            return loss

        def on_train_epoch_start(self):
            path = self.trainer.logger.metrics_file_path
            seen_on_disk.append(read_csv(path) if os.path.exists(path) else None)

    logger = CSVLogger(tmp_path, flush_logs_every_n_steps=2)
    trainer = fit(M(), logger=logger, log_every_n_steps=2)
    assert logger.metrics_file_path == os.path.join(trainer.log_dir, "metrics.csv")
    assert seen_on_disk[0] is None and [r["step"] for r in seen_on_disk[1]] == ["1", "3"]
    with open(logger.metrics_file_path) as f:  # Lightning's header: the columns sorted
        assert f.readline().strip() == "a,epoch,late,once,step,train_loss"
    rows = read_csv(logger.metrics_file_path)
    assert [(r["step"], r["a"], r["epoch"], r["late"], r["once"]) for r in rows] == [
        ("1", "2.0", "0", "", "7.0"), ("3", "4.0", "0", "", "7.0"), ("5", "6.0", "1", "60.0", ""),
        ("7", "8.0", "1", "80.0", "")]  # epoch an int, as Lightning writes it
    assert float(rows[-1]["train_loss"]) == pytest.approx(float(trainer.callback_metrics["train_loss"]))
    with open(os.path.join(trainer.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"lr": 0.1}

    # the Trainer saves after each write (Lightning's); a direct log_metrics is buffered until
    # (step + 1) % flush_logs_every_n_steps == 0 (Lightning's rule)
    logger = CSVLogger(tmp_path, name="buffered", flush_logs_every_n_steps=3)
    logger.log_metrics({"x": 1.0}, step=0)
    logger.log_metrics({"x": 2.0}, step=1)
    assert not os.path.exists(logger.metrics_file_path) and len(logger.experiment.metrics) == 2
    logger.log_metrics({"x": 3.0}, step=2)
    assert [r["x"] for r in read_csv(logger.metrics_file_path)] == ["1.0", "2.0", "3.0"] and not logger.metrics


def test_csv_logger_one_row_per_write_and_epoch_values(tmp_path):
    logger = CSVLogger(tmp_path, version="run")
    trainer = fit(Squares(), logger=logger, log_every_n_steps=4, val=loader(8))
    assert trainer.log_dir == str(tmp_path / "lightning_logs" / "run")
    rows = read_csv(logger.metrics_file_path)
    # one row per write, as Lightning's: the step values, the epoch-end validation, then the epoch values
    assert [(r["step"], r["square"], bool(r["loss_epoch"]), bool(r["val_loss"])) for r in rows] == [
        ("3", "16.0", False, False), ("3", "", False, True), ("3", "", True, False),
        ("7", "64.0", False, False), ("7", "", False, True), ("7", "", True, False)]


def test_metric_names_ending_in_step_or_epoch(tmp_path):
    class M(Linear):
        def training_step(self, batch, batch_idx):
            self.log("acc_epoch", 0.5, on_step=False, on_epoch=True)  # its own name, not the epoch value of "acc"
            self.log("warm_step", 2.0)
            return super().training_step(batch, batch_idx)

    logger = CSVLogger(tmp_path)
    fit(M(), epochs=1, logger=logger, log_every_n_steps=2)
    rows = read_csv(logger.metrics_file_path)
    assert [(r["step"], r["warm_step"], r["acc_epoch"]) for r in rows] == [("1", "2.0", ""), ("3", "2.0", ""),
                                                                         ("3", "", "0.5")]


def test_loggers_write_on_rank_zero_only(tmp_path, monkeypatch):
    # the Trainer calls every logger on every rank (Lightning's rule): tasktrain's loggers act on global rank 0 only
    monkeypatch.setattr(Trainer, "is_global_zero", property(lambda self: False))
    monkeypatch.setattr(Trainer, "global_rank", property(lambda self: 1))
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
    # Lightning's point: at the start of steps 2, 4, 6, 8 (global_step 1, 3, 5, 7 before them), the rate they use
    assert sorted({int(r["step"]) for r in rows}) == [1, 3, 5, 7]
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


# -- the Lightning-style API of tasktrain.loggers --------------------------------------------------------------------
class Graph(Squares):
    def __init__(self):
        super().__init__()
        self.example_input_array = torch.zeros(2, 4)


def test_tensorboard_logger_arguments_properties_and_graph(tmp_path):
    from tasktrain.loggers import TensorBoardLogger as FromLoggers
    from tasktrain.callbacks.loggers import TensorBoardLogger as OldPath

    assert FromLoggers is TensorBoardLogger is OldPath
    logger = TensorBoardLogger(tmp_path, name="exp", version="run", prefix="train", sub_dir="tb", log_graph=True,
                               max_queue=5)
    assert (logger.save_dir, logger.name, logger.version) == (str(tmp_path), "exp", "run")
    assert logger.root_dir == str(tmp_path / "exp") and logger.log_dir == str(tmp_path / "exp" / "run" / "tb")
    trainer = fit(Graph(), epochs=1, logger=logger, log_every_n_steps=2)
    assert trainer.log_dir == logger.log_dir
    points, acc = scalars(logger.log_dir, "train-square")  # prefix joined with "-"
    assert points == [(1, 4.0), (3, 16.0)] and "square" not in acc.Tags()["scalars"]
    assert scalars(logger.log_dir, "train-hp_metric")[0] == [(0, -1.0)]  # default_hp_metric
    assert acc.Tags()["graph"]  # log_graph traced the module with example_input_array
    from torch.utils.tensorboard import SummaryWriter

    assert isinstance(logger.experiment, SummaryWriter)
    logger.log_metrics({"pair": {"a": 1.0, "b": torch.tensor(2.0)}}, step=7)  # dicts: add_scalars
    logger.log_hyperparams({"opt": {"lr": 0.5}}, metrics={"best": 0.25})
    logger.finalize("success")
    with pytest.raises(ValueError, match="not a number"):
        logger.log_metrics({"text": "hello"}, step=1)
    with open(os.path.join(logger.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"lr": 0.1, "opt": {"lr": 0.5}}  # added to the fit's hyper-parameters
    assert scalars(os.path.join(logger.log_dir, "train-pair_b"), "train-pair")[0] == [(7, 2.0)]
    assert scalars(logger.log_dir, "train-best")[0] == [(0, 0.25)]

    # no example_input_array: a warning that says what to set, and no graph
    quiet_logger = TensorBoardLogger(tmp_path, name="nograph", log_graph=True, default_hp_metric=False)
    with pytest.warns(UserWarning, match="example_input_array"):
        fit(Squares(), epochs=1, logger=quiet_logger)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tags = EventAccumulator(quiet_logger.log_dir).Reload().Tags()
    assert not tags["graph"] and "hp_metric" not in tags["scalars"]


def test_csv_logger_prefix_experiment_and_steps_without_a_number(tmp_path):
    logger = CSVLogger(tmp_path, name="", prefix="p", flush_logs_every_n_steps=1)
    assert logger.root_dir == str(tmp_path) and logger.log_dir == str(tmp_path / "version_0")
    assert isinstance(logger.experiment, ExperimentWriter) and logger.experiment.log_dir == logger.log_dir
    logger.log_metrics({"a": torch.tensor(1.5)})
    logger.log_metrics({"a": 2.5})
    logger.log_hyperparams({"lr": 0.1})
    logger.finalize("success")
    # a step of None: the row's place among the rows not saved yet (Lightning's), 0 again after each flush
    assert [(r["step"], r["p-a"]) for r in read_csv(logger.metrics_file_path)] == [("0", "1.5"), ("0", "2.5")]
    with open(os.path.join(logger.log_dir, "hparams.yaml")) as f:
        assert yaml.safe_load(f) == {"lr": 0.1}


def test_loggers_on_other_ranks_hand_out_a_do_nothing_experiment(tmp_path, monkeypatch):
    from tasktrain.loggers.logger import DummyExperiment

    monkeypatch.setenv("RANK", "1")  # before any Trainer set it up, the launcher's variables say the rank
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    tb, csv_logger = TensorBoardLogger(tmp_path, name="tb"), CSVLogger(tmp_path, name="csv")
    assert isinstance(tb.experiment, DummyExperiment)
    tb.experiment.add_image("x", None)  # user code on every rank: nothing happens
    tb.log_metrics({"a": 1.0}, 1)
    csv_logger.log_metrics({"a": 1.0}, 1)
    tb.log_hyperparams({"lr": 1})
    csv_logger.finalize("success")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("RANK", "0")
    assert not isinstance(tb.experiment, DummyExperiment)


def test_trainer_logger_forms_setters_and_finalize_status(tmp_path):
    from tasktrain import Logger

    class Recorder(Logger):
        def __init__(self):
            self.calls = []

        def log_metrics(self, metrics, step=None):
            self.calls.append(("metrics", step))

        def log_hyperparams(self, params):
            self.calls.append(("hparams", dict(params)))

        def log_graph(self, model, input_array=None):
            self.calls.append(("graph", type(model).__name__))

        def save(self):
            self.calls.append(("save",))

        def finalize(self, status):
            self.calls.append(("finalize", status))

    recorder = Recorder()
    trainer = fit(Squares(lr=0.2), epochs=1, logger=recorder, log_every_n_steps=4, default_root_dir=tmp_path)
    # each write of the Trainer is followed by save(), as Lightning's logger connector does
    assert recorder.calls == [("hparams", {"lr": 0.2}), ("graph", "Squares"), ("save",), ("metrics", 3), ("save",),
                              ("metrics", 3), ("save",), ("finalize", "success")]
    assert trainer.log_dir is None  # a logger without save_dir: None, as Lightning

    class Broken(Squares):
        def training_step(self, batch, batch_idx):
            raise RuntimeError("boom")

    recorder.calls.clear()
    with pytest.raises(RuntimeError, match="boom"):
        fit(Broken(), epochs=1, logger=recorder)
    assert recorder.calls[-1] == ("finalize", "failed")

    with pytest.raises(TypeError, match=r"logger=\[\.\.\., 'csv', \.\.\.\]: not a logger, it has no log_metrics"):
        Trainer(logger=[TensorBoardLogger(tmp_path), "csv"])
    trainer = Trainer(logger=False, enable_progress_bar=False)
    csv_logger = CSVLogger(tmp_path, name="set")
    trainer.logger = csv_logger
    assert trainer.loggers == [csv_logger] and trainer.callbacks[0] is csv_logger
    trainer.loggers = [recorder, csv_logger]
    assert trainer.logger is recorder and trainer.loggers == [recorder, csv_logger]
    trainer.logger = None
    assert trainer.loggers == [] and trainer.log_dir == trainer.default_root_dir


# -- Weights & Biases (offline) and MLflow (local stores), read back ----------------------------------------------------
def wandb_records(run):
    """The records of a finished offline wandb run, from its .wandb file: wandb's own protobuf records in
    LevelDB-style log blocks (a 7-byte file header; 32 KiB blocks of chunks, each with a 7-byte header: checksum,
    length, kind). wandb's service may still be writing the file when run.finish() returns: wait (bounded) for
    the run's last record, the exit record."""
    import glob
    import time

    (path,) = glob.glob(os.path.join(os.path.dirname(run.dir), "run-*.wandb"))
    deadline = time.monotonic() + 30
    while True:
        records = _read_wandb_file(path)
        if any(r.WhichOneof("record_type") == "exit" for r in records) or time.monotonic() > deadline:
            return records
        time.sleep(0.1)


def _read_wandb_file(path):
    from wandb.proto import wandb_internal_pb2

    with open(path, "rb") as f:
        data = f.read()
    assert data[:4] == b":W&B"
    pos, pending, records = 7, b"", []
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        if room < 7:  # a block's tail too short for a chunk header is padding
            pos += room
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0 or pos + 7 + length > len(data):  # not written yet
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_history(run):
    import json

    rows = []
    for record in wandb_records(run):
        if record.WhichOneof("record_type") == "history":
            rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item})
    return rows


def wandb_kind(run, kind):
    return [getattr(r, kind) for r in wandb_records(run) if r.WhichOneof("record_type") == kind]


class Validated(Squares):
    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))


def test_wandb_logger_offline_run_holds_metrics_config_and_checkpoints(tmp_path):
    import json

    from tasktrain import ModelCheckpoint, WandbLogger

    # (offline=True with log_model is Lightning's MisconfigurationException; wandb's own offline mode records the
    # artifacts with the run, for `wandb sync`)
    logger = WandbLogger(name="first", project="demo", save_dir=tmp_path, mode="offline", log_model=True,
                         tags=["t1"])
    assert logger.version is None and logger.name == "demo" and logger.save_dir == str(tmp_path)
    checkpoint = ModelCheckpoint(monitor="val_loss", save_top_k=2)
    module = Validated(lr=0.05)
    logger.watch(module, log="parameters", log_freq=1)
    trainer = fit(module, logger=logger, log_every_n_steps=2, val=loader(16), callbacks=[checkpoint],
                  enable_checkpointing=True)
    run = logger.experiment
    assert logger.version == run.id and run.name == "first" and run.project == "demo"
    assert trainer.log_dir == str(tmp_path)  # as Lightning: a W&B logger's save_dir
    assert checkpoint.dirpath_resolved(trainer) == str(tmp_path / "demo" / run.id / "checkpoints")
    logger.log_table("samples", columns=["x", "y"], data=[[1, 2]], step=8)
    run.finish()

    history = wandb_history(run)
    squares = [(row["trainer/global_step"], row["square"]) for row in history if "square" in row]
    assert squares == [(1, 4.0), (3, 16.0), (5, 36.0), (7, 64.0)]
    val = [(row["trainer/global_step"], row["val_loss"]) for row in history if "val_loss" in row]
    assert [s for s, _ in val] == [3, 7] and val[-1][1] == pytest.approx(float(trainer.callback_metrics["val_loss"]))
    assert [row["samples/_type"] for row in history if "samples/_type" in row] == ["table-file"]
    assert any("parameters/layer.weight/_type" in row for row in history)  # watch: wandb's histograms
    config = {item.key: json.loads(item.value_json) for c in wandb_kind(run, "config") for item in c.update}
    assert config["lr"] == 0.05
    (run_record,) = wandb_kind(run, "run")
    assert list(run_record.tags) == ["t1"]  # wandb.init arguments pass through
    # log_model=True: at the end of the fit, the two kept checkpoints, the best with the "best" alias
    artifacts = [a for a in wandb_kind(run, "artifact") if a.type != "run_table"]
    assert [a.type for a in artifacts] == ["model", "model"] and {a.name for a in artifacts} == {f"model-{run.id}"}
    files = {json.loads(a.metadata)["original_filename"]: list(a.aliases) for a in artifacts}
    best = os.path.basename(checkpoint.best_model_path)
    assert set(files) == {os.path.basename(p) for p in checkpoint.best_k_models} and "best" in files[best]
    assert all(json.loads(a.metadata)["score"] == pytest.approx(checkpoint.best_k_models[os.path.join(
        checkpoint.dirpath_resolved(trainer), json.loads(a.metadata)["original_filename"])]) for a in artifacts)

    # after wandb.finish(), the logger continues the same run instead of failing on a finished one
    logger.log_metrics({"after": 1.0}, step=9)
    assert logger.experiment is not run and logger.version == run.id
    again = logger.experiment
    again.finish()
    assert [row["after"] for row in wandb_history(again) if "after" in row] == [1.0]

    with pytest.raises(ValueError, match="log_model"):
        WandbLogger(log_model="best")
    with pytest.raises(ValueError, match="contradict"):
        WandbLogger(offline=True, mode="online")
    import lightning.pytorch.loggers as lightning_loggers

    from tasktrain.exceptions import MisconfigurationException

    refused = []
    for make in (WandbLogger, lightning_loggers.WandbLogger):  # Lightning's refusal, beside Lightning's own
        with pytest.raises(Exception) as error:
            make(offline=True, log_model="all")
        refused.append((type(error.value).__name__, str(error.value)))
    assert refused[0] == refused[1] and "cannot be uploaded in offline mode" in refused[0][1]
    assert isinstance(error.value, Exception) and pytest.raises(MisconfigurationException, WandbLogger, offline=True,
                                                                log_model=True)


def test_wandb_logger_pickled_on_rank_zero_starts_the_run_a_spawned_child_attaches_to(tmp_path):
    """Lightning's test_wandb_logger_init_before_spawn with the real (offline) wandb: pickling the logger (what
    ddp_spawn does) starts the run on global rank 0 and the copy carries what a child attaches with (wandb's attach id,
    and the run id); on another rank it starts none. A run wandb.finish() ended is continued under the same id and the
    copy carries the new run's attach id (Lightning's carries the finished run's: its child fails with wandb's "Unable
    to attach to run"). The spawned child itself: tests/test_lightning_beside_loggers.py."""
    import pickle

    import wandb

    from tasktrain.loggers import WandbLogger

    logger = WandbLogger(save_dir=tmp_path, project="spawn", offline=True)
    assert logger._experiment is None
    state = logger.__getstate__()
    run = logger._experiment
    assert run is not None and state["_experiment"] is None
    assert state["_attach_id"] == run._attach_id == run.id and state["_wandb_init"]["id"] == run.id
    other = WandbLogger(save_dir=tmp_path, project="spawn", offline=True)
    other._global_rank = 1
    assert pickle.loads(pickle.dumps(other))._attach_id is None and other._experiment is None
    wandb.finish()
    state = logger.__getstate__()
    assert logger._experiment is not run and logger.version == run.id
    assert state["_attach_id"] == logger._experiment._attach_id and not logger._experiment._is_finished
    wandb.finish()


def test_mlflow_logger_local_store_holds_metrics_params_status_and_checkpoints(tmp_path, monkeypatch):
    from tasktrain import MLFlowLogger, ModelCheckpoint

    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    store = tmp_path / "mlruns"
    logger = MLFlowLogger(experiment_name="exp", run_name="first", save_dir=str(store), tags={"team": "a"},
                          log_model="all", prefix="fit")
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"  # save_dir asked for MLflow's file store
    assert logger.save_dir == str(store)
    checkpoint = ModelCheckpoint(save_top_k=-1)
    trainer = fit(Squares(lr=0.05), logger=logger, log_every_n_steps=2, callbacks=[checkpoint], enable_checkpointing=True)
    client = logger.experiment
    from mlflow.tracking import MlflowClient

    assert isinstance(client, MlflowClient)
    run = client.get_run(logger.run_id)
    assert logger.version == run.info.run_id and logger.name == run.info.experiment_id
    assert run.info.run_name == "first" and run.data.tags["team"] == "a"
    assert run.data.params == {"lr": "0.05"} and run.info.status == "FINISHED"
    history = [(m.step, m.value) for m in client.get_metric_history(logger.run_id, "fit-square")]
    assert history == [(1, 4.0), (3, 16.0), (5, 36.0), (7, 64.0)]
    assert checkpoint.dirpath_resolved(trainer) == str(store / run.info.experiment_id / run.info.run_id / "checkpoints")
    # log_model="all": each checkpoint as it was saved, with its metadata
    assert sorted(a.path for a in client.list_artifacts(logger.run_id)) == ["epoch=0-step=4", "epoch=1-step=8"]
    assert sorted(a.path for a in client.list_artifacts(logger.run_id, "epoch=1-step=8")) == [
        "epoch=1-step=8/aliases.txt", "epoch=1-step=8/epoch=1-step=8.ckpt", "epoch=1-step=8/metadata.yaml"]

    # the same experiment, a failed run: status FAILED; bad names and text are said, not silently dropped
    class Broken(Squares):
        def training_step(self, batch, batch_idx):
            if self.global_step == 2:
                raise RuntimeError("boom")
            return super().training_step(batch, batch_idx)

    failed = MLFlowLogger(experiment_name="exp", tracking_uri=f"file:{store}")
    with pytest.raises(RuntimeError, match="boom"):
        fit(Broken(), logger=failed, log_every_n_steps=1)
    assert failed.experiment_id == logger.experiment_id
    assert client.get_run(failed.run_id).info.status == "FAILED"
    with pytest.warns(RuntimeWarning, match="Replacing a@b with ab"):  # (Lightning's category and words)
        failed.log_metrics({"a@b": 1.0}, step=3)
    with pytest.warns(UserWarning, match="text"):
        failed.log_metrics({"note": "hi"}, step=3)
    assert [(m.step, m.value) for m in client.get_metric_history(failed.run_id, "ab")] == [(3, 1.0)]
    with pytest.warns(UserWarning, match="cut"):
        failed.log_hyperparams({"long": "x" * 7000, "nested": {"k": 1}})
    params = client.get_run(failed.run_id).data.params
    assert params["nested/k"] == "1" and 0 < len(params["long"]) < 7000


@pytest.mark.timeout(180)
def test_every_logger_writes_on_rank_zero_only_under_ddp(tmp_path, monkeypatch):
    import glob
    import json
    import sys

    from ddp_scripts.common import run, script

    code, stdout, stderr, _ = run([sys.executable, script("loggers_ddp.py"), str(tmp_path)], 150, str(tmp_path))
    assert code == 0, f"stdout:\n{stdout}\nstderr:\n{stderr}"
    facts = [json.load(open(tmp_path / f"rank{r}.json")) for r in (0, 1)]
    logs = tmp_path / "logs"
    assert facts[0]["experiments"] == ["Run", "SummaryWriter", "ExperimentWriter", "MlflowClient",
                                       "OfflineExperiment"]  # (Lightning's class names)
    assert facts[1]["experiments"] == ["DummyExperiment"] * 5  # CSVLogger's too, as Lightning's
    run_id = facts[0]["wandb_id"]
    # the checkpoint folder comes from rank 0's run id, on both ranks
    assert [f["checkpoint_dir"] for f in facts] == [str(logs / "ddp" / run_id / "checkpoints")] * 2
    assert facts[1]["wandb_id"] is None and facts[1]["mlflow_run_id"] is None and facts[1]["comet_key"] is None
    assert len(glob.glob(str(logs / "wandb" / "offline-run-*"))) == 1
    assert os.listdir(logs / "tb") == ["version_0"] and os.listdir(logs / "csv") == ["version_0"]
    assert [r["square"] for r in read_csv(logs / "csv" / "version_0" / "metrics.csv")] == ["1.0", "4.0", "9.0", "16.0"]

    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    # the read-back uses MLflow's file store too (MLflow 3 refuses it unless asked; MLFlowLogger asks in its process)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(f"file:{logs / 'mlruns'}")
    (experiment,) = [e for e in client.search_experiments() if e.name == "ddp"]
    (run_info,) = client.search_runs([experiment.experiment_id])
    assert [m.value for m in client.get_metric_history(run_info.info.run_id, "square")] == [1.0, 4.0, 9.0, 16.0]
    events = EventAccumulator(str(logs / "tb" / "version_0"), size_guidance={"tensors": 0}).Reload()
    notes = [e.tensor_proto.string_val[0].decode() for e in events.Tensors("note/text_summary")]
    assert notes == ["rank 0"] * 4  # rank 1's add_text went to the stand-in
    from test_loggers_comet import archive  # (Comet's one offline archive, rank 0's)

    assert len(os.listdir(logs / "comet")) == 1
    found = archive(logs / "comet", facts[0]["comet_key"])
    assert [(step, value) for name, value, step, _ in found["metrics"] if name == "square"] == [
        (0, 1.0), (1, 4.0), (2, 9.0), (3, 16.0)]


# -- the Accelerator's trackers (Accelerate's GeneralTracker API) over the same back-ends -----------------------------
def test_trackers_write_every_backend_and_read_back(tmp_path, monkeypatch):
    import json

    import mlflow

    from tasktrain.tracking import CSVTracker, MLflowTracker, TensorBoardTracker, WandBTracker, make_trackers

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")  # MLflow's default store kind
    config = {"lr": 0.01, "batch_size": 8, "optimizer": "adamw"}
    trackers = make_trackers(["tensorboard", "wandb", "mlflow", "csv"], "proj", config, logging_dir=tmp_path,
                             init_kwargs={"wandb": {"dir": str(tmp_path), "name": "r1"},
                                          "mlflow": {"run_name": "r1", "tags": {"k": "v"}}})
    tb, wb, ml, cs = trackers
    assert [type(t) for t in trackers] == [TensorBoardTracker, WandBTracker, MLflowTracker, CSVTracker]
    assert [t.name for t in trackers] == ["tensorboard", "wandb", "mlflow", "csv"]
    assert [t.requires_logging_directory for t in trackers] == [True, False, False, True]
    for step in range(3):
        for t in trackers:
            t.log({"loss": 1.0 / (step + 1), "acc": torch.tensor(0.5 * step)}, step=step)
    tb.log({"note": "text goes to add_text", "pair": {"a": 1.0}}, step=3)
    wb.log({"weights": torch.arange(4.0)}, step=3)  # a tensor of several values goes to wandb as it is
    with pytest.warns(UserWarning, match="not a number"):
        ml.log({"note": "text", "loss": 0.25}, step=3)
    assert ml.tracker.info.run_id == mlflow.active_run().info.run_id  # the script's mlflow.log_* land in it
    mlflow.log_metric("from_script", 7.0, step=2)
    wandb_run, mlflow_run_id = wb.tracker, ml.tracker.info.run_id
    for t in trackers:
        t.finish()
    assert mlflow.active_run() is None

    # TensorBoard: logging_dir/proj, as Accelerate
    assert tb.logging_dir == str(tmp_path / "proj")
    points, acc = scalars(tb.logging_dir, "loss")
    assert points == [(0, 1.0), (1, 0.5), (2, pytest.approx(1 / 3))]
    assert "note/text_summary" in acc.Tags()["tensors"]
    with open(tmp_path / "proj" / "hparams.yaml") as f:
        assert yaml.safe_load(f) == config
    # CSV: logging_dir/proj/metrics.csv
    rows = read_csv(tmp_path / "proj" / "metrics.csv")
    assert [(r["step"], r["loss"], r["acc"]) for r in rows] == [("0", "1.0", "0.0"), ("1", "0.5", "0.5"),
                                                                ("2", str(1 / 3), "1.0")]
    # wandb: Accelerate's step is wandb's own step
    history = wandb_history(wandb_run)
    assert [(row["_step"], row["loss"]) for row in history if "loss" in row] == [(0, 1.0), (1, 0.5),
                                                                                   (2, pytest.approx(1 / 3))]
    assert [row["weights"] for row in history if row["_step"] == 3] == [[0, 1, 2, 3]]
    assert wandb_run.project == "proj" and wandb_run.name == "r1"
    config_seen = {item.key: json.loads(item.value_json) for c in wandb_kind(wandb_run, "config") for item in c.update}
    assert {k: config_seen[k] for k in config} == config
    # MLflow: experiment named after the project, in the sqlite store
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = client.get_run(mlflow_run_id)
    assert client.get_experiment(run.info.experiment_id).name == "proj"
    assert run.info.run_name == "r1" and run.data.tags["k"] == "v" and run.info.status == "FINISHED"
    assert run.data.params == {"lr": "0.01", "batch_size": "8", "optimizer": "adamw"}
    assert [(m.step, m.value) for m in client.get_metric_history(mlflow_run_id, "acc")] == [(0, 0.0), (1, 0.5),
                                                                                            (2, 1.0)]
    assert [m.value for m in client.get_metric_history(mlflow_run_id, "from_script")] == [7.0]
    assert [(m.step, m.value) for m in client.get_metric_history(mlflow_run_id, "loss")][-1] == (3, 0.25)
    assert "note" not in run.data.metrics


def test_log_with_is_checked_before_anything_runs(tmp_path, monkeypatch):
    from tasktrain.tracking import GeneralTracker, LoggerType, check_log_with, make_trackers

    class Mine(GeneralTracker):
        name = "mine"
        requires_logging_directory = False

        def __init__(self):
            super().__init__()
            self.calls = []

        @property
        def tracker(self):
            return self.calls

        def start(self):
            self.calls.append("start")

        def store_init_configuration(self, values):
            self.calls.append(("config", values))

        def log(self, values, step=None, **kwargs):
            self.calls.append(("log", values, step, kwargs))

    mine = Mine()
    assert check_log_with(None) == [] and check_log_with("tensorboard", tmp_path) == ["tensorboard"]
    assert check_log_with([LoggerType.WANDB, "wandb", mine, "csv"], tmp_path) == ["wandb", mine, "csv"]
    assert check_log_with("all", tmp_path) == ["tensorboard", "wandb", "mlflow"]  # installed here; csv when named
    (made,) = make_trackers(mine, "p", {"a": 1})
    made.log({"x": 1}, step=2, commit=False)
    assert mine.calls == ["start", ("config", {"a": 1}), ("log", {"x": 1}, 2, {"commit": False})]
    blank = GeneralTracker(_blank=True)
    assert blank.log({"x": 1}) is None and blank.finish() is None

    with pytest.raises(ValueError, match="includes tensorboard, which writes files under a logging directory"):
        check_log_with("all")
    with pytest.raises(ValueError, match="logging directory.*project_dir"):
        check_log_with(["csv"])
    with pytest.raises(ValueError, match="no comet_ml tracker.*GeneralTracker"):
        check_log_with(LoggerType.COMETML)
    with pytest.raises(ValueError, match="'neptune' is not a tracker"):
        check_log_with("neptune")
    with pytest.raises(TypeError, match=r"pass an instance, Mine\(...\)"):
        check_log_with(Mine)
    with pytest.raises(ValueError, match=r"\['wandB'\].*name no tracker"):
        make_trackers("csv", "p", logging_dir=tmp_path, init_kwargs={"wandB": {}})

    class Incomplete(GeneralTracker):
        name = "half"

    with pytest.raises(NotImplementedError, match="requires_logging_directory, tracker"):
        Incomplete()


def test_a_missing_extra_is_a_clear_error(tmp_path, monkeypatch):
    import sys

    from tasktrain.loggers import MLFlowLogger, WandbLogger
    from tasktrain.tracking import check_log_with

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now fails as if it were not installed
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ModuleNotFoundError, match=r"WandbLogger needs the `wandb` package.*tasktrain\[wandb\]"):
        WandbLogger(offline=True)
    with pytest.raises(ModuleNotFoundError, match=r"MLFlowLogger needs the `mlflow` package.*tasktrain\[mlflow\]"):
        MLFlowLogger()
    with pytest.raises(ModuleNotFoundError, match=r"log_with='wandb' needs .*pip install 'tasktrain\[wandb\]'"):
        check_log_with(["tensorboard", "wandb"], tmp_path)
    with pytest.raises(ModuleNotFoundError, match=r"tasktrain\[mlflow\]"):
        check_log_with("mlflow")
    assert check_log_with("all", tmp_path) == ["tensorboard"]  # "all": what is installed
