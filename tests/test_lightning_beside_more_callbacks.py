"""Lightning 2.6 beside tasktrain for DeviceStatsMonitor, SpikeDetection and ModelPruning (issue 37): the same
configuration runs under Lightning itself and under tasktrain (tiny model, CPU, one process) and what a user sees is
compared: the keys and steps written to the logger, the errors and their types, the batches a spike excludes and the
file that lists them, the pruning masks and weights, the pruned checkpoint. Lightning is a test dependency, imported
inside the tests only."""
import json
import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain
import tasktrain.callbacks
from tasktrain.exceptions import MisconfigurationException
from helpers import outcome

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv
from lightning.pytorch.utilities.exceptions import MisconfigurationException as LMisconfigurationException  # noqa


def data(n=12, batch_size=3):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g)
    return DataLoader(TensorDataset(x, x @ torch.ones(4, 1)), batch_size=batch_size)


def net_class(base):
    class Net(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.body = torch.nn.Linear(4, 8)
            self.head = torch.nn.Linear(8, 1)

        def forward(self, x):
            return self.head(torch.tanh(self.body(x)))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self(x), y)

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

        def test_step(self, batch, batch_idx):
            x, y = batch
            self.log("test_loss", torch.nn.functional.mse_loss(self(x), y))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)
    return Net


QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
             num_sanity_val_steps=0, accelerator="cpu", devices=1)


pytestmark = pytest.mark.usefixtures("quiet_lightning")  # (conftest.py: Lightning's level put back after each test)


def both(fn):
    """fn(namespace) under Lightning and under tasktrain: (Lightning's result, ours)."""
    from lightning.pytorch import callbacks as lightning_callbacks
    from lightning.pytorch import loggers as lightning_loggers

    lightning = dict(Trainer=lambda **kw: L.Trainer(**{**QUIET, **kw}), Module=L.LightningModule,
                     cb=lightning_callbacks, loggers=lightning_loggers, Misconfiguration=LMisconfigurationException)
    ours = dict(Trainer=lambda **kw: tasktrain.Trainer(**{**QUIET, **kw}), Module=tasktrain.TaskModule,
                cb=tasktrain.callbacks, loggers=tasktrain.loggers, Misconfiguration=MisconfigurationException)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(**lightning), fn(**ours)


# -- DeviceStatsMonitor ----------------------------------------------------------------------------------------------
def test_device_stats_monitor_writes_lightnings_keys_at_lightnings_steps(tmp_path):
    def run(Trainer, Module, cb, loggers, **_):
        written = []

        class Recording(loggers.CSVLogger):
            def log_metrics(self, metrics, step=None):
                keys = sorted(k for k in metrics if k.startswith("DeviceStatsMonitor"))
                if keys:
                    written.append((step, keys))
                super().log_metrics(metrics, step)

        results = {}
        for cpu_stats in (None, True, False):
            written.clear()
            trainer = Trainer(max_epochs=1, limit_train_batches=3, limit_val_batches=2, limit_test_batches=2,
                              log_every_n_steps=2, logger=Recording(tmp_path / type(Module).__name__),
                              callbacks=[cb.DeviceStatsMonitor(cpu_stats=cpu_stats)])
            trainer.fit(net_class(Module)(), data(), data())
            trainer.test(trainer.lightning_module, data())
            results[cpu_stats] = list(written)
        results["no logger"] = outcome(lambda: Trainer(max_epochs=1, callbacks=[cb.DeviceStatsMonitor()])
                                       .fit(net_class(Module)(), data()))
        # without a logger, validate/test are not refused (Lightning checks at fit only)
        results["test without logger"] = outcome(lambda: Trainer(callbacks=[cb.DeviceStatsMonitor()])
                                                 .test(net_class(Module)(), data()))
        return results

    lightning, ours = both(run)
    assert ours == lightning
    keys = {key for _, written in ours[None] for key in written}
    assert "DeviceStatsMonitor.on_train_batch_start/cpu_percent" in keys
    assert "DeviceStatsMonitor.on_validation_batch_end/cpu_vm_percent" in keys
    assert "DeviceStatsMonitor.on_test_batch_start/cpu_swap_percent" in keys
    # training: the batch about to be step 2 (start and end); validation and test: their 2nd batch (of that run);
    # the epoch-end validation at the last training batch's step, before it is counted (Lightning's)
    assert [(step, keys[0].split("/")[0]) for step, keys in ours[None]] == [
        (1, "DeviceStatsMonitor.on_train_batch_start"), (1, "DeviceStatsMonitor.on_train_batch_end"),
        (2, "DeviceStatsMonitor.on_validation_batch_start"), (2, "DeviceStatsMonitor.on_validation_batch_end"),
        (3, "DeviceStatsMonitor.on_test_batch_start"), (3, "DeviceStatsMonitor.on_test_batch_end")]
    assert ours[False] == [] and ours["no logger"] == "MisconfigurationException"


def test_device_stats_monitor_without_psutil_is_an_error_before_training(monkeypatch, tmp_path):
    import tasktrain.callbacks.device_stats_monitor as monitor_module

    monkeypatch.setattr(monitor_module, "_PSUTIL_AVAILABLE", False)
    for cpu_stats in (None, True):  # Lightning raises at the first batch for True: here before training too
        trainer = tasktrain.Trainer(**{**QUIET, "logger": tasktrain.CSVLogger(tmp_path)},
                                    callbacks=[tasktrain.callbacks.DeviceStatsMonitor(cpu_stats=cpu_stats)])
        module = net_class(tasktrain.TaskModule)()
        before = module.head.weight.detach().clone()
        with pytest.raises(ModuleNotFoundError, match="pip install psutil"):
            trainer.fit(module, data())
        assert torch.equal(module.head.weight, before)
    trainer = tasktrain.Trainer(**{**QUIET, "logger": tasktrain.CSVLogger(tmp_path), "max_epochs": 1,
                                   "log_every_n_steps": 1},
                                callbacks=[tasktrain.callbacks.DeviceStatsMonitor(cpu_stats=False)])
    trainer.fit(net_class(tasktrain.TaskModule)(), data())  # nothing to read: no psutil needed


# -- SpikeDetection --------------------------------------------------------------------------------------------------
def spike_module_class(base, losses):
    """A module whose training loss at batch i is losses[i] (through a weight of one, so that it has gradients)."""
    class Spiky(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(1, 1, bias=False)

        def training_step(self, batch, batch_idx):
            with torch.no_grad():
                self.layer.weight.fill_(1.0)
            return self.layer(torch.tensor([[losses[batch_idx]]])).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)
    return Spiky


SPIKE_CASES = [
    # (arguments, the losses of batches 0..7)
    (dict(), [1.0, 0.5, 0.4, 0.3, 5.0, 0.2, 0.2, 0.2]),                        # rtol=2: a spike at 4
    (dict(rtol=None, atol=0.5), [1.0, 0.5, 0.4, 0.3, 0.7, 1.2, 0.2, 0.2]),     # atol only: 1.2 - 0.58 >= 0.5
    (dict(mode="max", rtol=0.5), [1.0, 2.0, 3.0, 3.5, 0.5, 4.0, 4.0, 4.0]),    # a drop, in mode max
    (dict(window=2, rtol=0.5), [4.0, 4.0, 1.0, 1.0, 1.6, 1.0, 1.0, 1.0]),    # mean of the last 2: 1.6 vs 1
    (dict(), [1.0, 0.5, float("nan"), 0.3, 0.2, 0.2, 0.2, 0.2]),             # finite_only: NaN is a spike
    (dict(finite_only=False), [1.0, 0.5, float("nan"), 0.3, 0.2, 0.2, 0.2, 0.2]),  # ... not without it
    (dict(finite_only=False), [1.0, 0.5, float("-inf"), 0.3, 0.2, 0.2, 0.2, 0.2]),  # -inf went down: no spike
    (dict(warmup=5), [1.0, 0.5, 0.4, 0.3, 5.0, 0.2, 0.2, 0.2]),                # not checked before batch 5
    (dict(mode="sideways"), [1.0, 2.0, 3.0, 3.5, 0.5, 4.0, 4.0, 4.0]),         # Lightning's ValueError at batch 1
]


def test_spike_detection_stops_at_lightnings_batches_and_writes_its_file(tmp_path):
    def run(Trainer, Module, cb, **_):
        results = []
        for i, (kwargs, losses) in enumerate(SPIKE_CASES):
            folder = tmp_path / f"{Module.__name__}{i}"
            callback = cb.SpikeDetection(exclude_batches_path=folder, **kwargs)
            error = outcome(lambda: Trainer(max_epochs=1, default_root_dir=folder, callbacks=[callback]).fit(
                spike_module_class(Module, losses)(), DataLoader([1.0] * 8)))
            written = folder / "skip_batches.json"
            results.append((error, callback.bad_batches, json.loads(written.read_text()) if written.exists() else None,
                            str(callback.exclude_batches_path) == str(written), sorted(callback.state_dict())))
        # the default path: <default_root_dir>/skip_batches.json
        callback = cb.SpikeDetection()
        outcome(lambda: Trainer(max_epochs=1, default_root_dir=tmp_path / Module.__name__, callbacks=[callback]).fit(
            spike_module_class(Module, SPIKE_CASES[0][1])(), DataLoader([1.0] * 8)))
        results.append(str(callback.exclude_batches_path) == str(tmp_path / Module.__name__ / "skip_batches.json"))
        return results

    lightning, ours = both(run)
    # finite_only=False with a NaN / -inf loss: no spike under either; Lightning trains on, tasktrain's Trainer ends
    # the fit with FloatingPointError at the next log step (its non-finite loss guard, issue 38: docs/checkpointing.md)
    for i in (5, 6):
        assert lightning[i][0] == "ok" and ours[i][0] == "FloatingPointError"
        assert ours[i][1:] == lightning[i][1:] and ours[i][1] == []
    same = [i for i in range(len(ours)) if i not in (5, 6)]
    assert [ours[i] for i in same] == [lightning[i] for i in same]
    assert [r[1] for r in ours[:5]] == [[3, 4], [4, 5], [3, 4], [3, 4], [1, 2]]  # (the window's case: at 4)
    assert [r[2] for r in ours[:5]] == [r[1] for r in ours[:5]]  # the file holds them
    assert [r[0] for r in ours[:9]] == (["TrainingSpikeException"] * 5 + ["FloatingPointError"] * 2
                                        + ["ok", "ValueError"])


def test_spike_exception_at_lightnings_fabric_path_catches_the_stop(tmp_path):
    """Lightning defines TrainingSpikeException in lightning.fabric.utilities.spike (its callback module re-exports
    it); renamed, `tasktrain.utilities.spike`: the class the callback raises, caught by an except on that path."""
    from lightning.fabric.utilities.spike import TrainingSpikeException as Theirs
    from tasktrain.utilities.spike import TrainingSpikeException as Ours

    assert Ours is tasktrain.callbacks.TrainingSpikeException

    def caught(Trainer, Module, cb, exception):
        callback = cb.SpikeDetection(exclude_batches_path=tmp_path / Module.__name__)
        try:
            Trainer(max_epochs=1, default_root_dir=tmp_path / Module.__name__, callbacks=[callback], **QUIET).fit(
                spike_module_class(Module, SPIKE_CASES[0][1])(), DataLoader([1.0] * 8))
        except exception as error:
            return str(error), callback.bad_batches
        return None

    assert caught(tasktrain.Trainer, tasktrain.TaskModule, tasktrain.callbacks, Ours) == caught(
        L.Trainer, L.LightningModule, L.callbacks, Theirs) == ("Training spike detected in batch 4", [3, 4])


def test_spike_detection_state_dict_round_trip_and_message():
    from tasktrain.callbacks import SpikeDetection, TrainingSpikeException

    assert str(TrainingSpikeException(batch_idx=4)) == "Training spike detected in batch 4"
    assert issubclass(TrainingSpikeException, RuntimeError)
    first = SpikeDetection(window=2)
    for value in (1.0, 3.0, 5.0):
        first._update_stats(torch.tensor(value))
    assert first.running_mean == 4.0  # the last two
    second = SpikeDetection(window=2)
    second.load_state_dict(first.state_dict())  # (Lightning's fails here: it has no `running` attribute)
    assert second.running_mean == 4.0 and second.last_val == 5.0


# -- ModelPruning ----------------------------------------------------------------------------------------------------
def pruned_state(module):
    """Every parameter and buffer (masks and originals included), as plain lists."""
    return {k: v.detach().tolist() for k, v in module.state_dict().items()}


PRUNING_CASES = [
    # global L1 over every weight and bias, permanent at the end: the weights after fit
    dict(pruning_fn="l1_unstructured", amount=0.5),
    # one layer each, structured, amount and apply by epoch, lottery ticket, not permanent: the masks and originals
    dict(pruning_fn="ln_structured", use_global_unstructured=False, pruning_dim=1, pruning_norm=2,
         amount=lambda epoch: 2 if epoch == 0 else 0.25, apply_pruning=lambda epoch: epoch != 1,
         make_pruning_permanent=False, parameter_names=["weight"]),
    # at validation's end, the parameters given, no lottery ticket, not permanent
    dict(pruning_fn="l1_unstructured", use_global_unstructured=False, amount=0.3, prune_on_train_epoch_end=False,
         use_lottery_ticket_hypothesis=False, make_pruning_permanent=False, parameters_to_prune="body"),
]


def test_model_pruning_prunes_the_same_weights_and_saves_the_same_checkpoint_as_lightning(tmp_path, caplog):
    def run(Trainer, Module, cb, **_):
        results = []
        for i, kwargs in enumerate(PRUNING_CASES):
            module = net_class(Module)()
            if kwargs.get("parameters_to_prune") == "body":
                kwargs = {**kwargs, "parameters_to_prune": [(module.body, "weight"), (module.body, "bias")]}
            checkpoint = cb.ModelCheckpoint(dirpath=tmp_path / f"{Module.__name__}{i}", save_last=True)
            trainer = Trainer(max_epochs=3, limit_val_batches=1, enable_checkpointing=True,
                              callbacks=[cb.ModelPruning(verbose=2, **kwargs), checkpoint])
            caplog.clear()
            with caplog.at_level(logging.INFO, logger=cb.ModelPruning.__module__):  # (both put their lines there)
                trainer.fit(module, data(), data())
            lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Applied")]
            saved = torch.load(checkpoint.last_model_path, weights_only=False)["state_dict"]
            results.append((pruned_state(module), {k: v.tolist() for k, v in saved.items()}, lines))
        return results

    lightning, ours = both(run)
    for (l_state, l_saved, l_lines), (o_state, o_saved, o_lines) in zip(lightning, ours):
        assert list(o_state) == list(l_state)
        for key in l_state:
            assert torch.allclose(torch.tensor(o_state[key]), torch.tensor(l_state[key]), atol=1e-6), key
        assert sorted(o_saved) == sorted(l_saved)
        for key in l_saved:
            assert torch.allclose(torch.tensor(o_saved[key]), torch.tensor(l_saved[key]), atol=1e-6), key
        assert o_lines == l_lines and o_lines
    permanent, structured, at_validation = ours
    assert "body.weight" in permanent[0] and not any(k.endswith("_mask") for k in permanent[0])
    assert sum(v == 0.0 for row in permanent[0]["body.weight"] for v in row) > 0
    # permanent: the checkpoint (saved while the module still had its masks) holds plain pruned weights
    assert "body.weight" in permanent[1] and not any(k.endswith(("_orig", "_mask")) for k in permanent[1])
    assert "body.weight_mask" in structured[0] and "body.weight_mask" in structured[1]  # not permanent: the masks
    # ln_structured along dim 1: whole input columns of body.weight are zero in the mask
    mask = torch.tensor(structured[0]["body.weight_mask"])
    assert ((mask == 0).all(dim=0)).sum() >= 2 and ((mask == 0).any(dim=0) == (mask == 0).all(dim=0)).all()
    assert "body.bias_mask" in at_validation[0] and "head.weight_mask" not in at_validation[0]


PRUNING_REFUSED_OR_NOT = [
    dict(pruning_fn="l1_unstructured"), dict(pruning_fn="L1_Unstructured"), dict(pruning_fn="chocolate"),
    dict(pruning_fn={}), dict(pruning_fn=torch.nn.utils.prune.L1Unstructured(amount=0.5)),
    dict(pruning_fn=torch.nn.utils.prune.L1Unstructured), dict(pruning_fn=torch.nn.utils.prune.L1Unstructured,
                                                               use_global_unstructured=False),
    dict(pruning_fn="random_structured"), dict(pruning_fn="ln_structured", pruning_dim=0),
    dict(pruning_fn="ln_structured", pruning_dim=0, pruning_norm=1),
    dict(pruning_fn="ln_structured", pruning_dim=0, pruning_norm=1, use_global_unstructured=False),
    dict(pruning_fn="l1_unstructured", parameter_names=["chocolate"]), dict(pruning_fn="l1_unstructured", verbose=3),
    dict(pruning_fn="l1_unstructured", amount="half"), dict(pruning_fn="l1_unstructured", amount=None),
]


def test_model_pruning_refuses_what_lightning_refuses_with_its_messages():
    def run(cb, Trainer, Module, **_):
        results = []
        for kwargs in PRUNING_REFUSED_OR_NOT:
            try:
                cb.ModelPruning(**kwargs)
                results.append("ok")
            except Exception as error:  # noqa: BLE001
                results.append((type(error).__name__, str(error).replace("lightning.pytorch", "tasktrain")))
        # at set-up: a module that is not in the model, a parameter it does not have, a malformed list
        stranger = torch.nn.Linear(2, 2)
        for given in ([(stranger, "weight")], "body.chocolate", [("body", "weight")]):
            module = net_class(Module)()
            given = [(module.body, "chocolate")] if given == "body.chocolate" else given
            results.append(outcome(lambda: Trainer(max_epochs=1, callbacks=[
                cb.ModelPruning("l1_unstructured", parameters_to_prune=given)]).fit(module, data())))
        return results

    lightning, ours = both(run)
    assert ours == lightning
    assert ours[0] == "ok" and ours[2][0] == "MisconfigurationException" and ours[-3:] == [
        "MisconfigurationException"] * 3

