"""The callback system: event order, module-before-callback, cost of unused events, should_stop, clipping,
early stopping, the timer and the progress bar."""
import io
import logging
import math
import re
import time

import pytest
import torch
from helpers import Linear, loader, quiet

from tasktrain import Callback, EarlyStopping, GradientClipping, ModelCheckpoint, ProgressBar, Timer, Trainer
from tasktrain.callbacks.base import EVENTS
from tasktrain.callbacks.timer import parse_duration


class Recorder(Callback):
    """Records every event it receives, in order."""

    def __init__(self, log=None, tag=None):
        self.log = [] if log is None else log
        self.tag = tag


def _recording(event):
    def hook(self, trainer, module, *args, **kwargs):  # (setup/teardown get stage= by keyword, as in Lightning)
        self.log.append(event if self.tag is None else (self.tag, event))
    return hook


for _event in EVENTS:
    setattr(Recorder, _event, _recording(_event))


def _eval_run(stage, batches):
    per_batch = [f"on_{stage}_batch_start", f"on_{stage}_batch_end"] * batches
    return [f"on_{stage}_start", f"on_{stage}_epoch_start", *per_batch, f"on_{stage}_epoch_end", f"on_{stage}_end"]


TRAIN_BATCH = ["on_train_batch_start", "on_before_zero_grad", "on_before_backward", "on_after_backward",
               "on_before_optimizer_step", "on_train_batch_end"]


def test_event_order_of_a_small_fit_is_the_documented_one():
    """docs/callbacks.md, "Firing order": 2 epochs of 3 batches, validation of 2 batches, a sanity check of 1."""
    rec = Recorder()
    trainer = Trainer(max_epochs=2, callbacks=[ModelCheckpoint(), rec], logger=False, enable_progress_bar=False,
                      num_sanity_val_steps=1)
    trainer.fit(Linear(), loader(24), loader(16))
    epoch = ["on_train_epoch_start", *TRAIN_BATCH * 3, *_eval_run("validation", 2), "on_train_epoch_end",
             "on_save_checkpoint"]  # ModelCheckpoint is last: it saves after every other callback's epoch end
    expected = ["setup", "on_fit_start", "on_sanity_check_start", *_eval_run("validation", 1), "on_sanity_check_end",
                "on_train_start", *epoch, *epoch, "on_train_end", "on_fit_end", "teardown"]
    assert rec.log == expected

    rec.log.clear()
    trainer.test(Linear(), loader(16))
    assert rec.log == ["setup", *_eval_run("test", 2), "teardown"]
    rec.log.clear()
    trainer.predict(Linear(), loader(16))
    assert rec.log == ["setup", *_eval_run("predict", 2), "teardown"]


def test_resume_fires_on_load_checkpoint_before_fit_start_and_runs_the_sanity_check(tmp_path):
    trainer = Trainer(max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path)], logger=False,
                      enable_progress_bar=False, num_sanity_val_steps=1)
    trainer.fit(Linear(), loader(16), loader(8))
    rec = Recorder()
    trainer = Trainer(max_epochs=2, callbacks=[rec], logger=False, enable_progress_bar=False,
                      enable_checkpointing=False, num_sanity_val_steps=1)
    trainer.fit(Linear(), loader(16), loader(8), ckpt_path=str(tmp_path / "epoch=0-step=2.ckpt"))
    # a resumed fit runs the sanity check too, as Lightning 2.6's
    assert rec.log[:4] == ["setup", "on_load_checkpoint", "on_fit_start", "on_sanity_check_start"]
    assert rec.log.index("on_sanity_check_end") < rec.log.index("on_train_start")


def test_exception_event_then_teardown():
    class Boom(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            raise RuntimeError("boom at batch end")

    rec = Recorder()
    with pytest.raises(RuntimeError, match="boom"):
        Trainer(max_epochs=1, callbacks=[rec, Boom()], **quiet()).fit(Linear(), loader())
    # a run that raised gets on_exception and no teardown hooks, as in Lightning (tests/test_lightning_beside_hooks.py)
    assert rec.log[-2:] == ["on_train_batch_end", "on_exception"] and "teardown" not in rec.log


def test_callback_hooks_fire_before_the_modules_as_lightnings_and_monitors_after_at_train_epoch_end():
    log = []

    class M(Linear):
        def setup(self, stage):
            log.append(("module", "setup"))

        def on_train_epoch_end(self):
            self.log("logged_at_epoch_end", 1.0)
            log.append(("module", "on_train_epoch_end"))

        def on_validation_epoch_end(self):
            log.append(("module", "on_validation_epoch_end"))

        def on_train_batch_end(self, outputs, batch, batch_idx):
            log.append(("module", "on_train_batch_end"))

    class Watching(EarlyStopping):  # a monitoring callback: Lightning runs it after the module at train epoch end
        def on_train_epoch_end(self, trainer, module):
            log.append(("monitor", "on_train_epoch_end", "logged_at_epoch_end" in trainer.callback_metrics))

    first, second = Recorder(log, "first"), Recorder(log, "second")
    watching = Watching("train_loss", patience=100)
    Trainer(max_epochs=1, limit_train_batches=1, callbacks=[watching, first, second], **quiet()).fit(
        M(), loader(), loader(8))
    for event in ("setup", "on_train_batch_end", "on_validation_epoch_end"):
        order = [entry[0] for entry in log if entry[1] == event]
        assert order == ["first", "second", "module"], event
    order = [entry[0] for entry in log if entry[1] == "on_train_epoch_end"]
    assert order == ["first", "second", "module", "monitor"]
    assert ("monitor", "on_train_epoch_end", True) in log  # it sees what the module logged there


def test_loggers_are_sorted_first_and_model_checkpoint_last(tmp_path, monkeypatch):
    from tasktrain import CSVLogger
    from tasktrain.callbacks import progress

    for rich, expected in ((False, "ModelSummary"), (True, "RichModelSummary")):  # Lightning's rule, each branch
        monkeypatch.setattr(progress, "rich_available", lambda: rich)
        mc, rec, csv = ModelCheckpoint(dirpath=tmp_path), Recorder(), CSVLogger(tmp_path)
        trainer = Trainer(callbacks=[mc, rec, csv], logger=False, enable_progress_bar=False)
        summary = trainer.callbacks[2]  # enable_model_summary=True adds one (Lightning's default)
        assert trainer.callbacks == [csv, rec, summary, mc] and type(summary).__name__ == expected


def test_a_callback_costs_nothing_on_events_it_does_not_override():
    class EpochOnly(Callback):
        def on_train_epoch_end(self, trainer, module):
            pass

    trainer = Trainer(max_epochs=1, callbacks=[EpochOnly()], **quiet())
    trainer.fit(Linear(), loader(8))
    # the per-step events have no callable at all: the loop iterates an empty list there
    for event in ("on_train_batch_start", "on_train_batch_end", "on_before_backward", "on_after_backward",
                  "on_before_optimizer_step", "on_before_zero_grad"):
        assert trainer._all_hooks[event] == [], event
    assert len(trainer._all_hooks["on_train_epoch_end"]) == 1


def test_callback_state_dict_under_state_key(tmp_path):
    class Counter(Callback):
        def __init__(self):
            self.batches = 0

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.batches += 1

        def state_dict(self):
            return {"batches": self.batches}

        def load_state_dict(self, state):
            self.batches = state["batches"]

    trainer = Trainer(max_epochs=1, callbacks=[Counter()], **quiet())
    trainer.fit(Linear(), loader(16))
    trainer.save_checkpoint(tmp_path / "c.ckpt")
    ckpt = torch.load(tmp_path / "c.ckpt", weights_only=True)
    assert Counter().state_key.endswith("Counter")
    assert ckpt["callbacks"][Counter().state_key] == {"batches": 2}
    counter = Counter()
    Trainer(max_epochs=1, callbacks=[counter], **quiet()).fit(Linear(), loader(16), ckpt_path=tmp_path / "c.ckpt")
    assert counter.batches == 2  # restored, and the finished epoch was not trained again


# -- should_stop -------------------------------------------------------------------------------------------------
class StopAt(Callback):
    def __init__(self, step=None, epoch=None):
        self.step, self.epoch, self.batches_after = step, epoch, 0

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if trainer.should_stop:
            self.batches_after += 1

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if self.step is not None and trainer.global_step >= self.step:
            trainer.should_stop = True

    def on_train_epoch_end(self, trainer, module):
        if self.epoch is not None and trainer.current_epoch == self.epoch:
            trainer.should_stop = True


def test_should_stop_from_a_batch_stops_at_that_step():
    stop = StopAt(step=6)
    trainer = Trainer(max_epochs=10, callbacks=[stop], **quiet())
    trainer.fit(Linear(), loader(32))  # 4 batches an epoch: step 6 is in epoch 1
    # (the epoch it stopped inside counts once the loop ended, as Lightning's)
    assert trainer.global_step == 6 and trainer.current_epoch == 2 and stop.batches_after == 0


def test_should_stop_inside_an_accumulation_window_waits_for_the_step():
    class StopAtBatch(StopAt):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            if trainer.state.batch_in_epoch == 3:  # the first half of the second window (batches 2, 3)
                trainer.should_stop = True

    stop = StopAtBatch()
    trainer = Trainer(max_epochs=10, accumulate_grad_batches=2, callbacks=[stop], **quiet())
    trainer.fit(Linear(), loader(64))
    assert trainer.global_step == 2 and trainer.state.batch_in_epoch == 4 and stop.batches_after == 1


def test_should_stop_from_epoch_end_stops_after_that_epoch():
    trainer = Trainer(max_epochs=10, callbacks=[StopAt(epoch=2)], **quiet())
    trainer.fit(Linear(), loader(32))
    assert trainer.current_epoch == 3 and trainer.global_step == 12


# -- gradient clipping ------------------------------------------------------------------------------------------
class RecordingSGD(torch.optim.SGD):
    """Records the gradients' total 2-norm and largest magnitude when it steps: what the update really used."""

    def __init__(self, params, lr):
        super().__init__(params, lr=lr)
        self.norms, self.maxabs = [], []

    def step(self, closure=None):
        # (after the step: the Trainer's closure, which computes the gradients, runs inside it, as in Lightning;
        # the update leaves the gradients as they were)
        loss = super().step(closure)
        grads = [p.grad for group in self.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))))
        self.maxabs.append(max(float(g.abs().max()) for g in grads))
        return loss


class BigGradients(Linear):
    """Targets scaled up so that the unclipped gradient norm is in the hundreds."""

    def __init__(self, lr=1e-4, scale=100.0):
        super().__init__(lr)
        self.scale = scale

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self(x), self.scale * y)

    def configure_optimizers(self):
        self.opt = RecordingSGD(self.parameters(), lr=self.hparams.lr)
        return self.opt


def _unclipped_norms():
    module = BigGradients()
    Trainer(max_epochs=1, **quiet()).fit(module, loader(32))
    return module.opt.norms, module.opt.maxabs


def test_gradient_clipping_by_norm_bounds_what_the_optimizer_sees():
    norms, _ = _unclipped_norms()
    assert min(norms) > 10  # without clipping the bound below would not hold
    module = BigGradients()
    Trainer(max_epochs=1, gradient_clip_val=1.5, **quiet()).fit(module, loader(32))
    assert len(module.opt.norms) == 4
    assert all(n == pytest.approx(1.5, rel=1e-4) for n in module.opt.norms)


def test_gradient_clipping_by_value_bounds_every_element():
    _, maxabs = _unclipped_norms()
    assert min(maxabs) > 1
    module = BigGradients()
    Trainer(max_epochs=1, gradient_clip_val=0.25, gradient_clip_algorithm="value", **quiet()).fit(module, loader(32))
    assert all(m <= 0.25 + 1e-7 for m in module.opt.maxabs)
    assert all(m == pytest.approx(0.25) for m in module.opt.maxabs)  # large gradients sit on the bound


def test_gradient_clipping_logs_the_norm_before_clipping():
    pre_clip = []

    class PreClip(Callback):  # listed before the clipping callback: sees the raw gradients (fp32: no scaling)
        def on_before_optimizer_step(self, trainer, module, optimizer):
            pre_clip.append(float(torch.nn.utils.get_total_norm([p.grad for p in module.parameters()])))

    seen = []

    class Read(Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(float(trainer.callback_metrics["grad_norm"]))

    module = BigGradients()
    Trainer(max_epochs=1, callbacks=[PreClip(), GradientClipping(max_norm=1.0, log_norm=True), Read()],
            **quiet()).fit(module, loader(32))
    assert seen == pytest.approx(pre_clip, rel=1e-5) and min(seen) > 10
    assert all(n == pytest.approx(1.0, rel=1e-4) for n in module.opt.norms)


@pytest.mark.filterwarnings("ignore:precision='16-mixed' on CPU")
def test_gradient_clipping_under_fp16_happens_after_unscaling():
    # unscaled targets: fp16 gradients overflow only while GradScaler's scale is still at its initial 65536
    module = BigGradients(scale=1.0)
    from tasktrain.plugins import MixedPrecision  # (precision="16-mixed" on a CPU is bf16-mixed, as Lightning's)

    trainer = Trainer(max_epochs=1, plugins=[MixedPrecision("16-mixed", "cpu")], gradient_clip_val=0.05, **quiet())
    trainer.fit(module, loader(96, batch_size=8))
    assert trainer.strategy.precision.scaler.get_scale() >= 1024  # the loss really was scaled
    # clipped before unscaling, the optimizer would see ~0.05 / scale; clipped after, exactly the bound
    assert len(module.opt.norms) >= 6  # the steps GradScaler did not skip
    assert all(n == pytest.approx(0.05, rel=1e-3) for n in module.opt.norms)


def test_gradient_clipping_bad_arguments():
    with pytest.raises(ValueError, match="max_norm"):
        GradientClipping()
    with pytest.raises(ValueError, match="positive"):
        GradientClipping(max_norm=-1.0)
    with pytest.raises(ValueError, match="gradient_clip_algorithm"):
        Trainer(gradient_clip_val=1.0, gradient_clip_algorithm="l2", **quiet())


# -- early stopping ---------------------------------------------------------------------------------------------
class Scripted(Linear):
    """Logs `score` from a fixed sequence: one value per validation run."""

    def __init__(self, scores):
        super().__init__()
        self.scores, self.runs = list(scores), 0

    def on_validation_start(self):
        self.runs += 1 if not self.trainer.sanity_checking else 0

    def validation_step(self, batch, batch_idx):
        self.log("score", float(self.scores[self.runs - 1]) if self.runs else 0.0)


def _early_fit(scores, capsys=None, **kwargs):
    trainer_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in ("val_check_interval", "max_epochs")}
    stopper = EarlyStopping("score", **kwargs)
    trainer = Trainer(callbacks=[stopper], **{"max_epochs": len(scores), **trainer_kwargs}, **quiet())
    trainer.fit(Scripted(scores), loader(16), loader(8))
    return trainer, stopper


def test_early_stopping_stops_after_patience_checks_without_improvement(caplog):
    # best 3.0 at epoch 2; epochs 3, 4, 5 do not improve on it: the third of them stops the run
    with caplog.at_level(logging.INFO, logger="tasktrain.callbacks.early_stopping"):
        trainer, stopper = _early_fit([5, 4, 3, 3.5, 3.2, 3.1, 2, 1, 0], patience=3, verbose=True)
    assert trainer.current_epoch == 6 and stopper.stopped_epoch == 5 and trainer.global_step == 12
    assert stopper.best_score == 3.0 and stopper.best_epoch == 2
    # Lightning's message, logged (INFO, the module's logger) with verbose=True
    assert stopper.stopping_reason_message == stopper.reason == (
        "Monitored metric score did not improve in the last 3 records. Best score: 3.000. Signaling Trainer to stop.")
    assert stopper.reason in caplog.messages


def test_early_stopping_min_delta_and_mode_max():
    # improvements of 0.05 and 0.09 do not count with min_delta=0.1: stops at epoch 3 (best 1.0 at epoch 1)
    trainer, stopper = _early_fit([0.5, 1.0, 1.05, 1.09, 1.5, 3], mode="max", patience=2, min_delta=0.1)
    assert trainer.current_epoch == 4 and stopper.best_score == 1.0
    # without min_delta each of them improves: the run completes (current_epoch counts the 6 finished epochs)
    trainer, stopper = _early_fit([0.5, 1.0, 1.05, 1.09, 1.5, 3], mode="max", patience=2)
    assert trainer.current_epoch == 6 and stopper.stopped_epoch == 0 and trainer.should_stop is False


def test_early_stopping_thresholds_and_non_finite():
    trainer, stopper = _early_fit([5, 4, 0.5, 0.1], stopping_threshold=1.0)
    assert trainer.current_epoch == 3 and stopper.reason.startswith("Stopping threshold reached: score = 0.5 < 1.0.")
    trainer, stopper = _early_fit([5, 4, 50, 1], divergence_threshold=10.0)
    # Lightning's message, its "<" (the mode's order) included
    assert trainer.current_epoch == 3
    assert stopper.reason.startswith("Divergence threshold reached: score = 50.0 < 10.0.")
    trainer, stopper = _early_fit([5, 4, math.nan, 1])
    assert trainer.current_epoch == 3
    assert stopper.reason == "Monitored metric score = nan is not finite. Previous best value was 4.000. Signaling " \
                             "Trainer to stop."
    trainer, stopper = _early_fit([5, 4, math.nan, 1], check_finite=False, patience=5)
    assert trainer.current_epoch == 4 and stopper.stopped_epoch == 0 and stopper.best_score == 1.0


def test_early_stopping_checks_after_every_validation_inside_the_epoch():
    # 4 batches an epoch, validation after batch 2 and at the epoch end: two checks an epoch.
    # checks: 5, 4, 4.5, 4.6 -> the 2nd check without improvement is the 4th check: epoch 1, after batch 4
    stopper = EarlyStopping("score", patience=2)
    trainer = Trainer(max_epochs=5, val_check_interval=2, callbacks=[stopper], **quiet())
    trainer.fit(Scripted([5, 4, 4.5, 4.6, 1, 1, 1, 1, 1, 1]), loader(32), loader(8))
    assert trainer.current_epoch == 2 and trainer.global_step == 8
    # the mid-epoch check of epoch 2 never happened; stopping at a mid-epoch check stops at that step:
    stopper = EarlyStopping("score", patience=1)
    trainer = Trainer(max_epochs=5, val_check_interval=2, callbacks=[stopper], **quiet())
    trainer.fit(Scripted([5, 4, 4.5, 1, 1, 1, 1, 1, 1, 1]), loader(32), loader(8))
    assert trainer.current_epoch == 2 and trainer.global_step == 6 and stopper.stopped_step == 6


def test_early_stopping_without_validation_checks_training_metrics_each_epoch():
    class M(Linear):
        def on_train_epoch_end(self):
            self.log("plateau", [3.0, 2.0, 2.0, 2.0, 2.0][self.current_epoch])

    stopper = EarlyStopping("plateau", patience=2)
    trainer = Trainer(max_epochs=5, callbacks=[stopper], **quiet())
    trainer.fit(M(), loader(16))
    assert trainer.current_epoch == 4


def test_early_stopping_missing_metric_names_the_logged_ones():
    # Lightning's RuntimeError and words
    with pytest.raises(RuntimeError, match=r"metric `val_los` which is not available.*: `train_loss`, `val_loss`"):
        Trainer(max_epochs=2, callbacks=[EarlyStopping("val_los")], **quiet()).fit(Linear(), loader(16), loader(8))
    with pytest.raises(ValueError, match="`mode` can be min, max, got lowest"):
        EarlyStopping("x", mode="lowest")


def test_early_stopping_state_round_trip():
    stopper = EarlyStopping("score", patience=3)
    stopper.best_score, stopper.wait_count = torch.tensor(1.5), 2
    other = EarlyStopping("score", patience=3)
    other.load_state_dict(stopper.state_dict())
    assert (float(other.best_score), other.wait_count) == (1.5, 2) and "best_epoch" not in stopper.state_dict()
    assert EarlyStopping("a").state_key != EarlyStopping("b").state_key
    # a checkpoint saved under tasktrain's earlier key (sorted settings) still restores the state
    from tasktrain.trainer.run_state import Callbacks
    restored = EarlyStopping("score", patience=3)
    Callbacks([restored]).load_state_dict({"EarlyStopping{'mode': 'min', 'monitor': 'score'}": stopper.state_dict()})
    assert restored.wait_count == 2 and float(restored.best_score) == 1.5


# -- timer ------------------------------------------------------------------------------------------------------
def test_timer_stops_once_the_budget_is_spent(caplog):
    class Slow(Linear):
        def training_step(self, batch, batch_idx):
            time.sleep(0.02)
            return super().training_step(batch, batch_idx)

    timer = Timer(duration={"seconds": 0.2})
    trainer = Trainer(max_epochs=1000, callbacks=[timer], **quiet())
    started = time.monotonic()
    trainer.fit(Slow(), loader(32))
    assert timer.elapsed() >= 0.2 and time.monotonic() - started >= 0.2
    assert 0 < trainer.global_step < 4000 and trainer.should_stop  # stopped long before max_epochs
    # Lightning's message, logged on the "tasktrain" logger (INFO, shown on stderr)
    assert "Time limit reached. Elapsed time is 0:00:00. Signaling Trainer to stop." in caplog.messages
    assert timer.state_dict()["time_elapsed"]["train"] >= 0.2

    trainer = Trainer(max_epochs=1000, max_time="00:00:00:0.1", **quiet())  # Trainer(max_time=...) adds a Timer
    trainer.fit(Slow(), loader(32))
    assert any(isinstance(c, Timer) for c in trainer.callbacks) and trainer.global_step < 4000
    assert [c._duration for c in trainer.callbacks if isinstance(c, Timer)] == [0.1]  # Lightning's: seconds
    # a Timer among the callbacks wins over max_time, as in Lightning (which says so)
    caplog.clear()
    trainer = Trainer(max_time={"seconds": 1337}, callbacks=[Timer(duration=5)], **quiet())
    assert [c._duration for c in trainer.callbacks if isinstance(c, Timer)] == [5]
    assert any("callbacks list already contains a Timer" in m for m in caplog.messages)


def test_timer_counts_time_of_the_run_it_resumes():
    timer = Timer(duration="00:00:01:00")
    timer.load_state_dict({"elapsed": 61.0})  # a resumed run that already spent the budget stops at once
    trainer = Trainer(max_epochs=10, callbacks=[timer], **quiet())
    trainer.fit(Linear(), loader(32))
    assert trainer.global_step == 0  # checked at fit start, once the state is loaded (Lightning's rule)
    assert parse_duration("01:02:03:04").total_seconds() == 93784
    with pytest.raises(ValueError, match="DD:HH:MM:SS"):
        Timer(duration="1 hour")


# -- progress bar -----------------------------------------------------------------------------------------------
class Shown(Linear):
    def training_step(self, batch, batch_idx):
        loss = super().training_step(batch, batch_idx)
        self.log("shown", 0.25, prog_bar=True)
        return loss


def test_progress_bar_draws_lightnings_bars_and_reads_metrics_at_lightnings_updates(capsys, monkeypatch):
    from tasktrain import TQDMProgressBar
    from tasktrain.callbacks import progress
    from tasktrain.trainer.metrics import MetricStore

    monkeypatch.setattr(progress, "rich_available", lambda: False)  # the default without rich: tqdm's output read

    reads = []
    original = MetricStore.progress_bar_metrics
    monkeypatch.setattr(MetricStore, "progress_bar_metrics", lambda self: reads.append(1) or original(self))
    trainer = Trainer(max_epochs=3, logger=False, enable_checkpointing=False, num_sanity_val_steps=0)
    assert isinstance(trainer.progress_bar_callback, TQDMProgressBar)  # the default, as Lightning's without rich
    trainer.fit(Shown(), loader(32), loader(8))
    text = capsys.readouterr().out  # Lightning's bars write to stdout
    for epoch in range(3):
        assert f"Epoch {epoch}: 100%" in text and f"Epoch {epoch}:" in text
    assert "4/4" in text and "shown=0.250" in text and "Validation DataLoader 0" in text
    assert "train_loss" not in text  # not prog_bar=True: not shown
    # the redraw waits for refresh_interval (0.1 s), the postfix does not: as under Lightning the metrics are read at
    # each of an epoch's 4 batches (refresh_rate=1), at the end of its validation and at its end
    assert len(reads) == 3 * (4 + 2)


def test_progress_bar_refresh_interval_zero_redraws_at_every_refresh_rate(capsys):
    from tasktrain import TQDMProgressBar

    class Counting(TQDMProgressBar):
        refresh_interval = 0
        postfixes = 0

        def get_metrics(self, trainer, module):
            Counting.postfixes += 1
            return super().get_metrics(trainer, module)

    bar = Counting(refresh_rate=2)
    Trainer(max_epochs=1, callbacks=[bar], logger=False, enable_checkpointing=False).fit(Shown(), loader(64))
    assert Counting.postfixes == 8 // 2 + 1  # every 2nd of 8 batches, then the epoch's end
    assert bar.train_progress_bar.n == 8 and bar.train_progress_bar.total == 8


def test_progress_bar_disabled(capsys, monkeypatch):
    from tasktrain import TQDMProgressBar
    from tasktrain.exceptions import MisconfigurationException

    trainer = Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)
    assert not any(isinstance(c, ProgressBar) for c in trainer.callbacks) and trainer.progress_bar_callback is None
    trainer.fit(Shown(), loader(16))
    assert "Epoch" not in capsys.readouterr().out
    with pytest.raises(MisconfigurationException, match="`enable_progress_bar=False` but found `TQDMProgressBar`"):
        Trainer(callbacks=[TQDMProgressBar()], enable_progress_bar=False, logger=False)
    with pytest.raises(MisconfigurationException, match="multiple progress bar callbacks"):
        Trainer(callbacks=[TQDMProgressBar(), TQDMProgressBar()], logger=False)
    bar = TQDMProgressBar(refresh_rate=0)  # Lightning's: refresh_rate=0 draws nothing
    assert bar.is_disabled and not bar.is_enabled
    Trainer(max_epochs=1, callbacks=[bar], logger=False, enable_checkpointing=False).fit(Shown(), loader(16))
    assert "Epoch" not in capsys.readouterr().out
    # on a rank other than 0, setup disables it: it prints nothing
    monkeypatch.setattr(Trainer, "is_global_zero", property(lambda self: False))
    other = TQDMProgressBar()
    Trainer(max_epochs=1, callbacks=[other], logger=False, enable_checkpointing=False).fit(Shown(), loader(16))
    assert other.is_disabled and "Epoch" not in capsys.readouterr().out
