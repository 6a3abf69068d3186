"""self.log beside Lightning 2.6 (issue 37): the same tiny module runs under Lightning and under tasktrain, logging from
every hook each framework calls; what each call does (logged, or refused with which exception and words) and what
reaches trainer.callback_metrics / logged_metrics / progress_bar_metrics are compared exactly. Lightning's spec is its
_FxValidator table (which hook may log, with which on_step/on_epoch defaults and allowed values) and its results
collection (which dict receives step and epoch values). Lightning is a test dependency, imported inside the tests
only."""
import warnings
from collections import Counter

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv
torchmetrics = pytest.importorskip("torchmetrics")  # the `torchmetrics` extra (requirements-dev.txt)


def loader(n=2):
    x = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3) / 10
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=1)


def outcome(fn):
    """'ok', or the exception's class name and words (Lightning's "LightningModule" read as "TaskModule")."""
    try:
        fn()
        return "ok"
    except Exception as exc:  # noqa: BLE001 (what is compared is which exception)
        return type(exc).__name__, str(exc).replace("LightningModule", "TaskModule")


# The module hooks both frameworks call (the step and data hooks are written out in the class: their signatures are
# read); each logs its own name with the hook's defaults, a value that changes per call (a mean and a last value differ)
MODULE_HOOKS = (
    "setup", "configure_model", "on_fit_start", "on_train_start", "on_train_epoch_start", "on_train_batch_start",
    "on_before_backward", "on_after_backward", "on_before_optimizer_step", "on_before_zero_grad",
    "on_train_batch_end", "on_validation_model_zero_grad", "on_validation_model_eval", "on_validation_model_train",
    "on_validation_start", "on_validation_epoch_start", "on_validation_batch_start", "on_validation_batch_end",
    "on_validation_epoch_end", "on_validation_end", "on_train_epoch_end", "on_train_end", "on_fit_end", "teardown",
    "on_save_checkpoint", "on_before_batch_transfer", "on_after_batch_transfer", "on_test_start",
    "on_test_epoch_start", "on_test_batch_start", "on_test_batch_end", "on_test_epoch_end", "on_test_end",
    "on_test_model_eval", "on_test_model_train", "on_predict_start", "on_predict_batch_start", "on_predict_end",
    "on_predict_model_eval", "prepare_data", "configure_callbacks")
CALLBACK_HOOKS = (
    "setup", "on_fit_start", "on_sanity_check_start", "on_sanity_check_end", "on_train_start",
    "on_train_epoch_start", "on_train_batch_start", "on_before_backward", "on_after_backward",
    "on_before_optimizer_step", "on_before_zero_grad", "on_train_batch_end", "on_validation_start",
    "on_validation_epoch_start", "on_validation_batch_start", "on_validation_batch_end", "on_validation_epoch_end",
    "on_validation_end", "on_train_epoch_end", "on_train_end", "on_fit_end", "teardown", "on_save_checkpoint",
    "on_test_start", "on_test_batch_end", "on_test_epoch_end", "on_test_end", "on_predict_start",
    "on_predict_batch_end")


def logging_module(base):
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)
            self.outcomes, self.calls = {}, Counter()

        def try_log(self, owner, hook, **kwargs):
            self.calls[owner, hook] += 1
            name = f"{owner}.{hook}"
            self.outcomes.setdefault(name, set()).add(
                outcome(lambda: self.log(name, float(self.calls[owner, hook]), **kwargs)))

        def loss(self, batch):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def training_step(self, batch, batch_idx):
            self.try_log("module", "training_step")
            return self.loss(batch)

        def validation_step(self, batch, batch_idx):
            self.try_log("module", "validation_step")

        def test_step(self, batch, batch_idx):
            self.try_log("module", "test_step")

        def predict_step(self, batch, batch_idx):
            self.try_log("module", "predict_step")
            return batch[0]

        def transfer_batch_to_device(self, batch, device, dataloader_idx):
            self.try_log("module", "transfer_batch_to_device")
            return batch

        def configure_optimizers(self):
            self.try_log("module", "configure_optimizers")
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            self.try_log("module", "train_dataloader")
            return loader()

        def val_dataloader(self):
            self.try_log("module", "val_dataloader")
            return loader()

        def test_dataloader(self):
            return loader()

        def predict_dataloader(self):
            return loader()

    def wrap(hook):
        def logging_hook(self, *args, **kwargs):
            out = getattr(base, hook)(self, *args, **kwargs)
            self.try_log("module", hook)
            return out
        return logging_hook

    for hook in MODULE_HOOKS:
        setattr(Net, hook, wrap(hook))
    return Net


def logging_callback(base):
    class Logs(base):
        pass

    def wrap(hook):
        def logging_hook(self, trainer, pl_module, *args, **kwargs):
            pl_module.try_log("callback", hook)
        return logging_hook

    for hook in CALLBACK_HOOKS:
        setattr(Logs, hook, wrap(hook))
    return Logs


def numbers(metrics):
    return {k: round(float(v), 6) for k, v in metrics.items()}


def run_every_hook(trainer_class, module_base, callback_base, tmp_path):
    module = logging_module(module_base)()
    trainer = trainer_class(default_root_dir=tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=2,
                            num_sanity_val_steps=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, callbacks=[logging_callback(callback_base)()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
        seen = {"fit": (numbers(trainer.callback_metrics), numbers(trainer.logged_metrics))}
        trainer.validate(module, verbose=False)
        seen["validate"] = (numbers(trainer.callback_metrics), numbers(trainer.logged_metrics))
        trainer.test(module, verbose=False)
        seen["test"] = (numbers(trainer.callback_metrics), numbers(trainer.logged_metrics))
        trainer.predict(module)
    return module.outcomes, seen


def test_self_log_in_every_hook_is_allowed_refused_and_defaulted_as_in_lightning(tmp_path):
    ours = run_every_hook(tasktrain.Trainer, tasktrain.TaskModule, tasktrain.Callback, tmp_path / "ours")
    lit = run_every_hook(L.Trainer, L.LightningModule, L.Callback, tmp_path / "lit")
    assert ours[0] == lit[0]  # per hook: logged, or refused with Lightning's exception and words
    # the hooks that refuse logging were seen (setup, the data hooks, checkpoint hooks, predict ...): a real check
    refused = {hook for hook, results in ours[0].items() if "ok" not in results}
    assert {"module.setup", "module.transfer_batch_to_device", "module.on_save_checkpoint", "callback.on_fit_end",
            "module.predict_step", "callback.on_sanity_check_start", "module.configure_optimizers"} <= refused
    # what each hook's defaults made of the values: step values (the last) or epoch values (the mean), the same keys
    for stage in ("fit", "validate", "test"):
        assert ours[1][stage] == lit[1][stage], stage


def step_and_epoch_module(base):
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def loss(self, batch):
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def training_step(self, batch, batch_idx):
            value = float(batch_idx + 1)
            self.log("t_step", value, on_step=True, on_epoch=False, prog_bar=True)
            self.log("t_both", value, on_step=True, on_epoch=True, prog_bar=True)
            self.log("t_sum", value, on_step=False, on_epoch=True, reduce_fx="sum")
            self.log("t_hidden", value, logger=False)
            return self.loss(batch)

        def validation_step(self, batch, batch_idx):
            value = float(batch_idx + 1) * 10
            self.log("v_step", value, on_step=True, on_epoch=False, prog_bar=True)
            self.log("v_both", value, on_step=True, on_epoch=True, prog_bar=True)
            self.log("v_default", value)
            self.log("v_max", value, reduce_fx="max", prog_bar=True)

        def test_step(self, batch, batch_idx):
            self.log("x_both", float(batch_idx) + 0.5, on_step=True, on_epoch=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)
    return Net


def run_step_and_epoch(trainer_class, module_base, tmp_path):
    module = step_and_epoch_module(module_base)()
    trainer = trainer_class(default_root_dir=tmp_path, max_epochs=1, num_sanity_val_steps=2, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader(3), loader(2))
        seen = [numbers(trainer.callback_metrics), numbers(trainer.logged_metrics),
                numbers(trainer.progress_bar_metrics)]
        results = trainer.test(module, loader(2), verbose=False)
    return seen + [numbers(trainer.callback_metrics), numbers(trainer.logged_metrics), results]


def test_step_and_epoch_values_reach_lightnings_dicts(tmp_path):
    ours = run_step_and_epoch(tasktrain.Trainer, tasktrain.TaskModule, tmp_path / "ours")
    lit = run_step_and_epoch(L.Trainer, L.LightningModule, tmp_path / "lit")
    assert ours == lit
    callback_metrics, logged_metrics, bar = ours[:3]
    # an evaluation's step values reach the loggers' dict and the bar, never callback_metrics (training's do)
    assert "v_step" not in callback_metrics and "v_both_step" not in callback_metrics
    assert logged_metrics["v_step"] == 20.0 and bar["v_step"] == 20.0 and callback_metrics["t_both_step"] == 3.0
    assert "t_hidden" in callback_metrics and "t_hidden" not in logged_metrics  # logger=False
    assert logged_metrics["t_step"] == 3.0  # filled without a logger and between log_every_n_steps writes


def refusals_module(base):
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)
            self.attribute_metric = torchmetrics.MeanMetric()
            self.outcomes = {}

        def training_step(self, batch, batch_idx):
            if batch_idx == 0:
                stray = torchmetrics.MeanMetric()
                stray.update(1.0)
                self.attribute_metric.update(1.0)
                for case, call in (
                        ("not useful", lambda: self.log("a", 1.0, on_step=False, on_epoch=False)),
                        ("custom reduce_fx", lambda: self.log("b", 1.0, reduce_fx=torch.median)),
                        ("dataloader_idx in the name", lambda: self.log("c/dataloader_idx_0", 1.0)),
                        ("first", lambda: self.log("d", 1.0)),
                        ("twice, other arguments", lambda: self.log("d", 1.0, prog_bar=True)),
                        ("a Metric that is no attribute", lambda: self.log("e", stray)),
                        ("an attribute's Metric", lambda: self.log("f", self.attribute_metric, on_epoch=True,
                                                                         on_step=False)),
                        ("two elements", lambda: self.log("g", torch.ones(2)))):
                    self.outcomes[case] = outcome(call)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def on_train_epoch_end(self):
            self.outcomes["on_step in an epoch hook"] = outcome(lambda: self.log("h", 1.0, on_step=True))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)
    return Net


def run_refusals(trainer_class, module_base, tmp_path):
    module = refusals_module(module_base)()
    trainer = trainer_class(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader(2))
    return module.outcomes, numbers(trainer.callback_metrics)


def test_self_log_refuses_what_lightning_refuses_with_its_words(tmp_path):
    ours = run_refusals(tasktrain.Trainer, tasktrain.TaskModule, tmp_path / "ours")
    lit = run_refusals(L.Trainer, L.LightningModule, tmp_path / "lit")
    assert ours == lit
    outcomes = ours[0]
    assert outcomes["not useful"] == ("MisconfigurationException",
                                      "`self.log(on_step=False, on_epoch=False)` is not useful.")
    assert outcomes["a Metric that is no attribute"][0] == "MisconfigurationException"
    assert outcomes["on_step in an epoch hook"] == (
        "MisconfigurationException", "You can't `self.log(on_step=True)` inside `on_train_epoch_end`, must be one of "
        "(False,).")
    assert outcomes["first"] == outcomes["an attribute's Metric"] == "ok" and ours[1] == {"d": 1.0, "f": 1.0}


def test_without_a_trainer_self_log_warns_and_logs_nothing():
    with pytest.warns(UserWarning, match="`self.trainer` reference is not registered"):
        tasktrain.TaskModule().log("x", 1.0)


def plateau_module(base):
    class Net(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)
            self.validations, self.lrs = 0, []

        def training_step(self, batch, batch_idx):
            self.lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def validation_step(self, batch, batch_idx):
            self.log("val_metric", float(self.validations))  # worse at every validation: the plateau reduces

        def on_validation_epoch_end(self):
            self.validations += 1

        def configure_optimizers(self):
            optimizer = torch.optim.SGD(self.parameters(), lr=1.0)
            plateau = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0)
            return [optimizer], [{"scheduler": plateau, "interval": "step", "monitor": "val_metric", "strict": False}]
    return Net


def run_plateau(trainer_class, module_base, tmp_path):
    module = plateau_module(module_base)()
    trainer = trainer_class(default_root_dir=tmp_path, max_epochs=1, val_check_interval=2, limit_val_batches=1,
                            num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, loader(6), loader(1))
    return module.lrs, trainer.lr_scheduler_configs[0].scheduler.last_epoch


def test_a_step_plateau_scheduler_steps_after_the_batchs_validation_as_in_lightning(tmp_path):
    # validations after batches 1, 3 and 5: a plateau of interval "step" sees each one's value at that batch
    ours = run_plateau(tasktrain.Trainer, tasktrain.TaskModule, tmp_path / "ours")
    lit = run_plateau(L.Trainer, L.LightningModule, tmp_path / "lit")
    assert ours == lit
    # batch 1's step sees the 1st validation (its best), batch 2's the same value again (no better: halved), ...;
    # stepped before the validation (tasktrain before), batch 1's step had no value and each halving came a batch later
    assert ours == ([1.0, 1.0, 1.0, 0.5, 0.25, 0.125], 5)


def several_loaders_module(base, hook):
    class Shared(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            if hook == "step":  # every loader logs the same unsuffixed name: Lightning refuses the second
                self.log("shared", float(dataloader_idx), add_dataloader_idx=False)
            else:  # one loader only, and in the epoch-end hook: allowed
                if dataloader_idx == 1:
                    self.log("shared", float(batch_idx), add_dataloader_idx=False)
                self.log("each", float(dataloader_idx))

        def on_validation_epoch_end(self):
            if hook != "step":
                self.log("shared", 5.0, add_dataloader_idx=False)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.0)

    return Shared


@pytest.mark.parametrize("hook", ["step", "one loader"])
def test_add_dataloader_idx_false_from_several_loaders_as_lightning(hook):
    seen = []
    for lib, base in ((tasktrain, tasktrain.TaskModule), (L, L.LightningModule)):
        trainer = lib.Trainer(max_epochs=1, limit_train_batches=1, logger=False, enable_progress_bar=False,
                              enable_checkpointing=False, enable_model_summary=False, num_sanity_val_steps=0)
        module = several_loaders_module(base, hook)()
        result = outcome(lambda: trainer.fit(module, loader(), [loader(), loader(3)]))
        # (after the refusal Lightning's callback_metrics hold what it had collected: not compared)
        seen.append((result, numbers(trainer.callback_metrics) if result == "ok" else None))
    assert seen[0] == seen[1]
    if hook == "step":
        assert seen[0][0] == ("MisconfigurationException", "You called `self.log(shared, ...)` twice in "
                              "`validation_step` with different arguments. This is not allowed")
    else:
        assert seen[0] == ("ok", {"each/dataloader_idx_0": 0.0, "each/dataloader_idx_1": 1.0, "shared": 5.0})


def _structured_batches(kind):
    """Four batches of `kind`, the last one short (3 then 1 samples): what self.log infers their size from."""
    def one(n, i):
        x = torch.full((n, 3), float(i))
        return {"dict": {"x": x, "y": x.sum(1)},
                "list": [x, x.sum(1)],
                "nested": {"inputs": [x, {"mask": torch.ones(n + 2)}], "y": x.sum(1)},  # later sizes disagree
                "scalar first": [torch.tensor(5.0), x],
                "strings first": {"names": [f"s{k}" for k in range(n)], "x": x},  # (strings have no size)
                "no tensor": {"names": [f"s{k}" for k in range(n)], "ids": list(range(n))}}[kind]

    return [one(3 if i < 3 else 1, i) for i in range(4)]


def _features(batch):
    if isinstance(batch, dict) and "ids" in batch:
        return torch.ones(len(batch["ids"]), 3)
    if isinstance(batch, dict):
        return batch["inputs"][0] if "inputs" in batch else batch["x"]
    return batch[1] if batch[0].ndim == 0 else batch[0]


def run_structured(trainer_class, base, kind):
    class Module(base):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(_features(batch)).pow(2).mean()
            self.log("seen", torch.tensor(float(batch_idx + 1)), on_step=False, on_epoch=True)
            self.log("given", torch.tensor(float(batch_idx + 1)), on_step=False, on_epoch=True, batch_size=2)
            return loss

        def on_train_epoch_end(self):  # (outside a batch: no size inferred)
            self.log("at_end", torch.tensor(7.0), on_epoch=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = trainer_class(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                            enable_model_summary=False, accelerator="cpu", devices=1, num_sanity_val_steps=0)
    batches = _structured_batches(kind)
    loader = DataLoader(range(len(batches)), batch_size=1, collate_fn=lambda index: batches[index[0]])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = outcome(lambda: trainer.fit(Module(), loader))
    ambiguous = [str(w.message) for w in caught if "ambiguous collection" in str(w.message)]
    return result, numbers(trainer.callback_metrics) if result == "ok" else None, ambiguous


@pytest.mark.parametrize("kind", ["dict", "list", "nested", "scalar first", "strings first", "no tensor"])
def test_the_batch_size_self_log_infers_weights_epoch_means_as_lightnings(kind):
    import lightning.pytorch.utilities.data as lightning_data

    from tasktrain.trainer import metrics

    lightning_data.warning_cache.clear()  # (each framework warns once a process: this test's runs both warn)
    metrics._ambiguity_warned.clear()
    theirs = run_structured(L.Trainer, L.LightningModule, kind)
    ours = run_structured(tasktrain.Trainer, tasktrain.TaskModule, kind)
    assert ours == theirs
    result, values, ambiguous = ours
    if kind == "no tensor":  # nothing in the batch has a size: Lightning's error and words
        assert result == ("MisconfigurationException", metrics.CANNOT_INFER_BATCH_SIZE)
        return
    size = {"scalar first": 1}.get(kind, 3)  # (a scalar tensor first: 1 for every batch)
    expected = (1 * size + 2 * size + 3 * size + 4 * 1) / (3 * size + 1)
    assert values["seen"] == pytest.approx(expected) and values["given"] == 2.5 and values["at_end"] == 7.0
    # a warning per distinct message (the short last batch's says 1)
    assert len(ambiguous) == {"nested": 2, "scalar first": 1}.get(kind, 0)


def test_a_value_logged_in_an_epoch_end_hook_reads_back_in_that_hook(tmp_path):
    """Lightning's callback_metrics computes the epoch values while an epoch's end hooks run, so a value self.log'd in
    on_train/validation/test_epoch_end is in trainer.callback_metrics right after the call (a mean, a sum of batch
    values, in the sanity check too); tasktrain published it only after the hook (found by Lightning's
    test_on_epoch_logging_with_sum_and_on_batch_start)."""
    def run(trainer_class, module_base, folder):
        read = []

        class Net(module_base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)

            def training_step(self, batch, batch_idx):
                x, y = batch
                return torch.nn.functional.mse_loss(self.layer(x), y)

            def validation_step(self, batch, batch_idx):
                self.log("v_sum", 1.0, reduce_fx="sum")

            test_step = validation_step

            def on_train_batch_end(self, *_):
                self.log("t_sum", 1.0, on_step=False, on_epoch=True, reduce_fx="sum")

            def epoch_end(self, name):
                self.log(name, 3.0)
                self.log(name + "_max", 2.0, reduce_fx="max")
                read.append((name, self.trainer.sanity_checking, numbers(self.trainer.callback_metrics)))

            def on_train_epoch_end(self):
                self.epoch_end("train_end")

            def on_validation_epoch_end(self):
                self.epoch_end("val_end")

            def on_test_epoch_end(self):
                self.epoch_end("test_end")

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        trainer = trainer_class(default_root_dir=folder, max_epochs=1, num_sanity_val_steps=2, logger=False,
                                enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = Net()
            trainer.fit(module, loader(3), loader(2))
            trainer.test(module, loader(2), verbose=False)
        return read

    ours = run(tasktrain.Trainer, tasktrain.TaskModule, tmp_path / "ours")
    lit = run(L.Trainer, L.LightningModule, tmp_path / "lit")
    assert ours == lit
    assert [(name, sanity) for name, sanity, _ in ours] == [("val_end", True), ("val_end", False), ("train_end", False),
                                                           ("test_end", False)]
    assert ours[2][2]["train_end"] == 3.0 and ours[2][2]["t_sum"] == 3.0 and ours[3][2]["test_end_max"] == 2.0


def run_not_floating(trainer_class, module_base, tmp_path):
    class Net(module_base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            # names of this test only: both frameworks warn once per message per process
            self.log("nf_int_tensor", torch.tensor(batch_idx + 1))
            self.log("nf_bool_tensor", torch.tensor(True))
            self.log("nf_python_int", batch_idx + 1)  # converted without a word
            self.log("nf_half", torch.tensor(0.5, dtype=torch.float16))  # kept as float32 (no word either)
            x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = trainer_class(default_root_dir=tmp_path, max_epochs=1, logger=False, enable_progress_bar=False,
                            enable_model_summary=False, enable_checkpointing=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(Net(), loader(2))
    said = [(w.category.__name__, str(w.message)) for w in caught if "needs to be floating" in str(w.message)]
    metrics = {k: (v.dtype, float(v)) for k, v in trainer.callback_metrics.items() if k.startswith("nf_")}
    return said, metrics


def test_a_tensor_that_is_not_floating_is_converted_with_lightnings_warning(tmp_path):
    # (and a half-precision one is kept as float32, as Lightning keeps it: callback_metrics' dtype)
    ours = run_not_floating(tasktrain.Trainer, tasktrain.TaskModule, tmp_path / "ours")
    lit = run_not_floating(L.Trainer, L.LightningModule, tmp_path / "lit")
    assert ours == lit
    said, metrics = ours
    assert [message.split("`")[1] for _, message in said] == ["self.log('nf_int_tensor', ...)",
                                                               "self.log('nf_bool_tensor', ...)"]  # once each
    assert said[0][0] == "UserWarning" and "in your `training_step`" in said[0][1]
    assert metrics == {"nf_int_tensor": (torch.float32, 2.0), "nf_bool_tensor": (torch.float32, 1.0),
                       "nf_python_int": (torch.float32, 2.0), "nf_half": (torch.float32, 0.5)}


def test_a_metric_whose_compute_is_not_a_tensor_raises_lightnings_words(tmp_path):
    """A torchmetrics Metric whose compute() returns a tuple, logged from a hook: a ValueError under both, its message
    starting with Lightning's words (scripts and tests match them), at the same point of the run."""
    torchmetrics = pytest.importorskip("torchmetrics")

    class Pair(torchmetrics.Metric):
        def update(self):
            pass

        def compute(self):
            return torch.tensor(1.0), torch.tensor(2.0)

    def run(trainer_class, base, root):
        class Net(base):
            def __init__(self):
                super().__init__()
                self.layer = torch.nn.Linear(3, 1)
                self.metric = Pair()
                self.steps = 0

            def on_train_start(self):
                self.log("foo", self.metric)

            def training_step(self, batch, batch_idx):
                self.steps += 1
                return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

            def configure_optimizers(self):
                return torch.optim.SGD(self.parameters(), lr=0.01)

        module = Net()
        trainer = trainer_class(default_root_dir=root, max_epochs=1, logger=False, enable_progress_bar=False,
                                enable_model_summary=False, enable_checkpointing=False, limit_val_batches=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with pytest.raises(ValueError) as info:
                trainer.fit(module, loader(2))
        return str(info.value), module.steps

    lit_words, lit_steps = run(L.Trainer, L.LightningModule, tmp_path / "lit")
    words, steps = run(tasktrain.Trainer, tasktrain.TaskModule, tmp_path / "ours")
    assert lit_words.startswith("The `.compute()` return of the metric logged as 'foo' must be a tensor. Found (")
    assert words.startswith(lit_words) and steps == lit_steps
