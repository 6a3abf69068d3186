"""Lightning 2.6 beside tasktrain (issue 37): the BatchSizeFinder and LearningRateFinder callbacks. The same tiny
module (a batch larger than a threshold raises the out-of-memory error a GPU raises) under both frameworks: the
batch sizes found (callback at fit / test start, the Tuner), a subclass that searches at epoch milestones (when its
search runs, what the epochs then read, the weights put back), the learning-rate finder's attribute, the optimizers'
rate and the module's weights afterwards, and the errors and warnings of both. Lightning is a test dependency."""
import logging
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import tasktrain

L = pytest.importorskip("lightning.pytorch")  # requirements-dev.txt pins it: the skip only hides a broken venv
from lightning.pytorch import callbacks as lightning_callbacks  # noqa: E402
from lightning.pytorch.tuner import Tuner as LightningTuner  # noqa: E402

from tasktrain import callbacks as tasktrain_callbacks  # noqa: E402
from tasktrain.tuner import Tuner as TasktrainTuner  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
             accelerator="cpu", devices=1)
FRAMEWORKS = {"lightning": (L.Trainer, L.LightningModule, lightning_callbacks, LightningTuner),
              "tasktrain": (tasktrain.Trainer, tasktrain.TaskModule, tasktrain_callbacks, TasktrainTuner)}


def _data(n):
    x = torch.randn(n, 4, generator=torch.Generator().manual_seed(1))
    return TensorDataset(x, x.sum(1, keepdim=True))


def _module(framework, fits=20, n=64, seen=None):
    Trainer, Module, _, _ = FRAMEWORKS[framework]

    class Net(Module):
        def __init__(self):
            super().__init__()
            self.batch_size, self.lr = 2, 0.01
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def _loss(self, batch):
            if batch[0].shape[0] > fits:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def training_step(self, batch, batch_idx):
            if seen is not None:
                seen.append(("train", self.trainer.current_epoch, batch[0].shape[0]))
            return self._loss(batch)

        def test_step(self, batch, batch_idx):
            if seen is not None:
                seen.append(("test", batch[0].shape[0]))
            self._loss(batch)

        def predict_step(self, batch, batch_idx):
            self._loss(batch)
            return batch[0].shape[0]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.lr)

        def predict_dataloader(self):
            return DataLoader(_data(n), batch_size=self.batch_size)

        def train_dataloader(self):
            return DataLoader(_data(n), batch_size=self.batch_size)

        def test_dataloader(self):
            return DataLoader(_data(n), batch_size=self.batch_size)

    return Net()


def _run(framework, fn):
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fn(*FRAMEWORKS[framework])


def _both(fn):
    theirs, ours = _run("lightning", fn), _run("tasktrain", fn)
    assert ours == theirs
    return ours


@pytest.mark.parametrize("kwargs", [
    dict(mode="power", init_val=8), dict(mode="binsearch", init_val=8), dict(mode="power", init_val=4, max_trials=2),
])
def test_the_size_found_at_fit_start_is_lightnings(kwargs):
    def case(Trainer, Module, callbacks, Tuner):
        finder = callbacks.BatchSizeFinder(steps_per_trial=1, **kwargs)
        module = _module("lightning" if Trainer is L.Trainer else "tasktrain", fits=12)
        Trainer(max_epochs=1, limit_train_batches=1, callbacks=[finder], **QUIET).fit(module)
        return finder.optimal_batch_size, module.batch_size

    found = _both(case)
    # power: 8 fits, 16 does not; binsearch: then 12 fits, 14 and 13 do not, less its 5% margin; 2 trials: 4, 8
    assert found[0] == found[1] == {"power": 8, "binsearch": 11}[kwargs["mode"]] if "max_trials" not in kwargs \
        else found[0] == found[1] == 8


def test_tuner_and_test_stage_sizes_are_lightnings_and_the_run_reads_the_size_found():
    def case(Trainer, Module, callbacks, Tuner):
        name = "lightning" if Trainer is L.Trainer else "tasktrain"
        tuned = _module(name, fits=12)
        by_tuner = Tuner(Trainer(max_epochs=1, **QUIET)).scale_batch_size(tuned, init_val=8, steps_per_trial=1)
        seen = []
        module = _module(name, fits=16, seen=seen)
        finder = callbacks.BatchSizeFinder(mode="power", steps_per_trial=1, init_val=8)
        Trainer(callbacks=[finder], **QUIET).test(module, verbose=False)
        return by_tuner, tuned.batch_size, finder.optimal_batch_size, [s for s in seen if s[1] == 16]

    by_tuner, attribute, at_test, test_batches = _both(case)
    assert by_tuner == attribute == 8 and at_test == 16
    assert len(test_batches) == 1 + 64 // 16  # one trial batch, then the test run itself at the size found


def test_predict_stage_size_reaches_the_prediction_writers_batch_indices():
    # the predict run reads the size found, and a writer's batch indices are those of the loaders built again
    def case(Trainer, Module, callbacks, Tuner):
        class Writer(callbacks.BasePredictionWriter):
            def __init__(self):
                super().__init__("batch_and_epoch")
                self.batches, self.epoch = [], None

            def write_on_batch_end(self, trainer, module, prediction, batch_indices, batch, batch_idx, dataloader_idx):
                self.batches.append((prediction, list(batch_indices)))

            def write_on_epoch_end(self, trainer, module, predictions, batch_indices):
                self.epoch = (predictions, [list(one) for one in batch_indices[0]])

        name = "lightning" if Trainer is L.Trainer else "tasktrain"
        writer, finder = Writer(), callbacks.BatchSizeFinder(mode="power", steps_per_trial=1, init_val=8)
        returned = Trainer(callbacks=[finder, writer], **QUIET).predict(_module(name, fits=16, n=40))
        return finder.optimal_batch_size, returned, writer.batches, writer.epoch

    size, returned, batches, epoch = _both(case)
    assert size == 16 and returned == [16, 16, 8]
    assert batches == [(16, list(range(16))), (16, list(range(16, 32))), (8, list(range(32, 40)))]
    assert epoch == (returned, [indices for _, indices in batches])


class _Milestones:
    """Lightning's documented subclass: the search at epoch 0 and at the milestones, not at fit start."""

    @staticmethod
    def make(base):
        class FineTuneBatchSizeFinder(base):
            def __init__(self, milestones, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.milestones, self.found = milestones, []

            def on_fit_start(self, *args, **kwargs):
                return

            def on_train_epoch_start(self, trainer, pl_module):
                if trainer.current_epoch in self.milestones or trainer.current_epoch == 0:
                    self.scale_batch_size(trainer, pl_module)
                    self.found.append((trainer.current_epoch, trainer.global_step, self.optimal_batch_size))

        return FineTuneBatchSizeFinder


def test_a_milestone_subclass_searches_at_its_epochs_and_the_epochs_read_the_size_found():
    """(tasktrain alone: Lightning 2.6.6's run of this documented subclass fails at the milestone, its trial's
    out-of-memory error escaping the fit) The search runs at epoch 0 and at the milestone, from the weights of that
    point, which are put back; the epoch that is starting trains at the size found."""
    seen = []
    module = _module("tasktrain", fits=8, n=32, seen=seen)
    finder = _Milestones.make(tasktrain_callbacks.BatchSizeFinder)(milestones=(2,), mode="power", steps_per_trial=1,
                                                                   init_val=4)
    trainer = tasktrain.Trainer(max_epochs=3, callbacks=[finder], **QUIET)
    weights = []

    class Watch(tasktrain_callbacks.Callback):
        def on_train_epoch_start(self, trainer, pl_module):  # (after the finder: the finders sort first)
            weights.append(pl_module.layer.weight.detach().clone())

    trainer.callbacks.append(Watch())
    module.batch_size = 2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module)
    assert [(epoch, step, size) for epoch, step, size in finder.found] == [(0, 0, 8), (2, 8, 8)]
    trials = [s for s in seen if s[2] == 16]
    assert len(trials) == 2  # the failed trial at 16, once per search
    by_epoch = {}
    for _, epoch, size in seen:
        by_epoch.setdefault(epoch, []).append(size)
    assert by_epoch[1] == [8] * 4  # epoch 1 trains on the size found at epoch 0
    assert by_epoch[2][-4:] == [8] * 4 and trainer.global_step == 12
    assert not torch.equal(weights[0], weights[2])  # (trained by then) ...
    assert torch.equal(weights[2], module.layer.weight.detach()) is False  # ... and the epoch trained on after


def test_lr_finder_callback_sets_the_attribute_and_the_optimizers_rate_and_puts_the_weights_back():
    def case(Trainer, Module, callbacks, Tuner):
        name = "lightning" if Trainer is L.Trainer else "tasktrain"
        module = _module(name, fits=1000)
        before = [p.detach().clone() for p in module.parameters()]
        rates = []

        class Watch(callbacks.Callback):
            def on_train_start(self, trainer, pl_module):
                rates.append(trainer.optimizers[0].param_groups[0]["lr"])
                rates.append(all(torch.equal(a, b) for a, b in zip(before, pl_module.parameters())))

        finder = callbacks.LearningRateFinder(num_training_steps=20, early_stop_threshold=None)
        trainer = Trainer(max_epochs=1, callbacks=[Watch(), finder], **QUIET)
        trainer.fit(module)
        lr = finder.optimal_lr.suggestion()
        return (type(finder.optimal_lr).__name__.lstrip("_"), len(finder.optimal_lr.results["lr"]), module.lr == lr,
                rates[0] == lr, rates[1], trainer.global_step, [type(c).__name__ for c in trainer.callbacks][:1])

    found = _both(case)
    assert found[:2] == ("LRFinder", 20) and found[2:] == (True, True, True, 32, ["LearningRateFinder"])  # the finders sort first, as Lightning's


def test_errors_and_warnings_are_lightnings():
    def case(Trainer, Module, callbacks, Tuner):
        name = "lightning" if Trainer is L.Trainer else "tasktrain"
        outcomes = []

        def outcome(fn):
            try:
                fn()
                outcomes.append(None)
            except Exception as err:  # (the type's name and the start of the message: tasktrain's may add a hint)
                outcomes.append((type(err).__name__, str(err)[:60]))

        outcome(lambda: callbacks.BatchSizeFinder(mode="triple"))
        outcome(lambda: callbacks.BatchSizeFinder(margin=1.0))
        outcome(lambda: callbacks.LearningRateFinder(mode="cosine"))
        module = _module(name)
        given = DataLoader(_data(8), batch_size=2)
        outcome(lambda: Trainer(max_epochs=1, callbacks=[callbacks.BatchSizeFinder()], **QUIET).fit(module, given))

        class NoSize(type(module)):
            def __init__(self):
                super().__init__()
                del self.batch_size

        outcome(lambda: Trainer(max_epochs=1, callbacks=[callbacks.BatchSizeFinder()], **QUIET).fit(NoSize()))
        trainer = Trainer(max_epochs=1, callbacks=[callbacks.BatchSizeFinder(), callbacks.LearningRateFinder()],
                          **QUIET)
        outcome(lambda: Tuner(trainer).scale_batch_size(module))
        outcome(lambda: Tuner(trainer).lr_find(module))
        outcome(lambda: Tuner(Trainer(**QUIET)).lr_find(module, method="test"))
        outcome(lambda: Tuner(Trainer(**QUIET)).scale_batch_size(module, method="tune"))
        outcome(lambda: Tuner(Trainer(**QUIET)).scale_batch_size(module, dataloaders=given))
        # fast_dev_run: both finders skip with a warning, the fit goes on
        finders = [callbacks.BatchSizeFinder(), callbacks.LearningRateFinder()]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Trainer(fast_dev_run=True, callbacks=finders, **QUIET).fit(_module(name))
        outcomes.append(sorted(str(w.message) for w in caught if "Skipping" in str(w.message)))
        outcomes.append((finders[0].optimal_batch_size, finders[1].optimal_lr))
        return outcomes

    outcomes = _both(case)
    assert outcomes[0] == ("ValueError", "`mode` should be either of ('power', 'binsearch')")
    assert outcomes[3][0] == "MisconfigurationException" and outcomes[-1] == (None, None)
    assert len(outcomes[-2]) == 2


@pytest.mark.parametrize("mode,num_training,threshold,accumulate,max_epochs", [
    ("exponential", 40, 4.0, 1, 1000),   # 32 batches an epoch: the sweep crosses an epoch; diverges (early stop)
    ("linear", 30, 4.0, 1, 1000),
    ("exponential", 25, None, 1, 1000),  # no early stop: the whole sweep
    ("linear", 20, None, 3, 1000),       # accumulation: one point per window, the last micro-batch's loss
    ("exponential", 60, None, 1, 1),     # num_training beyond the loader, one epoch: the sweep ends with it
])
def test_lr_find_gives_lightnings_rates_losses_and_suggestion(mode, num_training, threshold, accumulate, max_epochs):
    def run(framework):
        Trainer, _, _, Tuner = FRAMEWORKS[framework]
        module = _module(framework)
        torch.manual_seed(3)
        trainer = Trainer(max_epochs=max_epochs, accumulate_grad_batches=accumulate, **QUIET)
        finder = Tuner(trainer).lr_find(module, min_lr=1e-4, max_lr=10.0, num_training=num_training, mode=mode,
                                        early_stop_threshold=threshold)
        return finder.results["lr"], finder.results["loss"], finder.suggestion(), finder.suggestion(2, 3), module.lr

    lightning, ours = run("lightning"), run("tasktrain")
    assert len(ours[0]) == len(lightning[0]) and len(ours[1]) == len(lightning[1])
    assert ours[0] == lightning[0]
    assert ours[1] == pytest.approx(lightning[1], rel=1e-5, nan_ok=True)
    assert ours[2:] == lightning[2:]  # (the same rates, the same index: equal, None where Lightning gives None)
