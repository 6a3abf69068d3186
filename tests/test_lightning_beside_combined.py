"""Several loaders beside Lightning 2.6 (issue 37): `CombinedLoader` (tasktrain.utilities) and its modes, fit on a
dict / nested structure of training loaders (Lightning wraps it in CombinedLoader(mode="max_size_cycle")) or on a
CombinedLoader, and evaluation on several loaders, a CombinedLoader(mode="sequential") or one in another mode (read
together: the combined batch, no dataloader_idx). The same script runs under
both frameworks on one process; the batches training_step / validation_step receive (sample indices), batch_idx,
dataloader_idx, num_training_batches, epoch ends, weights and errors are compared. A fit resumed in the middle of an
epoch continues with the batch an uninterrupted run takes next, an inner StatefulDataLoader from its own state (DDP:
tests/test_lightning_beside_ddp_order.py). DeepSpeed's micro-batch size of several loaders:
tests/test_lightning_strategies.py."""
import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.utilities import CombinedLoader as TheirCombinedLoader  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.utilities import CombinedLoader  # noqa: E402
from tasktrain.utilities.combined_loader import CombinedLoader as ByModule  # noqa: E402

QUIET = dict(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False)
FRAMEWORKS = {"lightning": (pl, pl.LightningModule, TheirCombinedLoader),
              "tasktrain": (tasktrain, tasktrain.TaskModule, CombinedLoader)}


def _data(n, first):
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(n))
    return TensorDataset(torch.arange(first, first + n), x, x.sum(1, keepdim=True))


def _train_loaders(shuffle):
    # 4, 2 and 1 batches: b's loaders run out (and cycle) before a's
    return {"a": DataLoader(_data(10, 0), batch_size=3, shuffle=shuffle),
            "b": [DataLoader(_data(4, 100), batch_size=2, shuffle=shuffle), DataLoader(_data(5, 200), batch_size=5)]}


def _indices(batch):
    if batch is None:
        return None
    if isinstance(batch, dict):
        return {key: _indices(value) for key, value in batch.items()}
    if isinstance(batch[0], torch.Tensor):
        return batch[0].tolist()
    return [_indices(one) for one in batch]


def _losses(layer, batch):
    if batch is None:
        return []
    if isinstance(batch, dict):
        return [loss for value in batch.values() for loss in _losses(layer, value)]
    if isinstance(batch[0], torch.Tensor):
        return [torch.nn.functional.mse_loss(layer(batch[1]), batch[2])]
    return [loss for one in batch for loss in _losses(layer, one)]


def _fit(name, mode=None, shuffle=False, saves=None, ckpt_path=None, **trainer_kwargs):
    lib, base, combined = FRAMEWORKS[name]
    torch.manual_seed(0)  # the weights, and the draws of the shuffling loaders
    rows = []

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            rows.append(["train", self.current_epoch, batch_idx, _indices(batch)])
            return sum(_losses(self.layer, batch))

        def on_train_epoch_end(self):
            rows.append(["epoch end", self.current_epoch, self.trainer.num_training_batches])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    module = Module()
    callbacks = [lib.callbacks.ModelCheckpoint(dirpath=saves, every_n_train_steps=1, save_top_k=-1,
                                               filename="{step}")] if saves else []
    trainer = lib.Trainer(max_epochs=2, callbacks=callbacks, enable_checkpointing=bool(saves), **QUIET,
                          **trainer_kwargs)
    loaders = _train_loaders(shuffle)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(module, combined(loaders, mode) if mode else loaders, ckpt_path=ckpt_path)
    loaded = trainer.train_dataloader  # Lightning's: the combined loader's iterables, in their structure
    structure = {key: type(value).__name__ for key, value in loaded.items()}
    return rows, [round(v, 6) for p in module.parameters() for v in p.detach().flatten().tolist()], structure


def test_combined_loader_alone_is_lightnings():
    assert CombinedLoader is ByModule
    for mode in ("min_size", "max_size_cycle", "max_size", "sequential"):
        for limits in (None, [1, 2], [5, 1]):
            seen = []
            for cls in (TheirCombinedLoader, CombinedLoader):
                combined = cls({"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)},
                               mode)
                combined.limits = limits
                with pytest.raises(RuntimeError, match="iter"):
                    len(combined)
                iter(combined)
                seen.append((len(combined), [repr(out) for out in combined],
                             {k: type(v).__name__ for k, v in combined.sampler.items()}))
            assert seen[0] == seen[1], (mode, limits)
    with pytest.raises(ValueError, match="Unsupported mode 'nope'"):
        CombinedLoader([], "nope")


@pytest.mark.parametrize("mode, shuffle, kwargs", [
    (None, False, {}),  # a dict of loaders: max_size_cycle
    ("max_size", True, {}),  # None for a loader that ran out; shuffled: the same draws as Lightning's
    ("min_size", False, {}),
    (None, True, {"limit_train_batches": 3}),
])
def test_fit_on_several_loaders_reads_lightnings_batches(mode, shuffle, kwargs):
    theirs = _fit("lightning", mode, shuffle, **kwargs)
    mine = _fit("tasktrain", mode, shuffle, **kwargs)
    assert mine == theirs
    assert mine[2] == {"a": "DataLoader", "b": "list"}
    ends = [row for row in mine[0] if row[0] == "epoch end"]
    length = {None: 4, "max_size": 4, "min_size": 1}[mode] if not kwargs else 3
    assert ends == [["epoch end", 0, length], ["epoch end", 1, length]]


def test_a_resumed_combined_fit_takes_the_next_batch(tmp_path):
    whole = _fit("tasktrain", "max_size_cycle", True, saves=str(tmp_path))
    batches = [row for row in whole[0] if row[0] == "train"]
    for step in (2, 3, 6):  # 2: b's first loader starts again there; 6: inside epoch 1
        again = _fit("tasktrain", "max_size_cycle", True, ckpt_path=os.path.join(tmp_path, f"step={step}.ckpt"))
        assert [row for row in again[0] if row[0] == "train"] == batches[step:], step
        assert again[1] == whole[1]
    # Lightning's resumed epoch reads its plain loaders again from their first batch (only loaders with a state_dict
    # resume), with batch_idx going on: a's batch 0 comes back as batch 2 (docs/lightning.md)
    theirs = _fit("lightning", "max_size_cycle", False, saves=str(tmp_path / "lightning"))
    again = _fit("lightning", "max_size_cycle", False, ckpt_path=str(tmp_path / "lightning" / "step=2.ckpt"))
    assert theirs[0][0][3]["a"] == again[0][0][3]["a"] == [0, 1, 2] and again[0][0][2] == 2


def _evaluate(name, how, mode=None):
    lib, base, combined = FRAMEWORKS[name]
    torch.manual_seed(0)
    rows = []

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[1]).sum()

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            rows.append([batch_idx, dataloader_idx, batch[0].tolist()])

        def predict_step(self, batch, batch_idx, dataloader_idx=0):
            return batch[0]

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = lib.Trainer(max_epochs=1, num_sanity_val_steps=0, enable_checkpointing=False, **QUIET)
    loaders = {"x": DataLoader(_data(5, 0), batch_size=2), "y": [DataLoader(_data(3, 50), batch_size=2)]}
    loaders = combined(loaders, mode) if mode else loaders
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if how == "fit":
                trainer.fit(Module(), DataLoader(_data(4, 0), batch_size=2), loaders)
            elif how == "validate":
                trainer.validate(Module(), loaders)
            elif how == "predict":
                rows = [[one.tolist() for one in each] for each in trainer.predict(Module(), loaders)]
            else:  # a sequential CombinedLoader to train on
                trainer.fit(Module(), combined({"a": DataLoader(_data(4, 0), batch_size=2),
                                                "b": DataLoader(_data(6, 50), batch_size=2)}, "sequential"))
    except ValueError as error:
        # (Lightning names its `_FitLoop`; it counts the loaders' batches, 2 + 3, before it refuses)
        return str(error).split("` does not support")[-1], trainer.num_training_batches
    return rows, trainer.num_val_batches


@pytest.mark.parametrize("how, mode", [("fit", None), ("fit", "sequential"), ("validate", "sequential"),
                                       ("validate", None), ("predict", None), ("predict", "sequential"),
                                       ("predict", "max_size"), ("train", None)])
def test_evaluation_on_several_loaders_is_lightnings(how, mode):
    theirs, mine = _evaluate("lightning", how, mode), _evaluate("tasktrain", how, mode)
    assert mine == theirs
    if how in ("fit", "validate"):
        assert mine == ([[0, 0, [0, 1]], [1, 0, [2, 3]], [2, 0, [4]], [0, 1, [50, 51]], [1, 1, [52]]], [3, 2])
    if how == "train":
        assert mine[1] == 5


def _evaluate_together(name, how, mode, **kwargs):
    """A CombinedLoader in min_size / max_size / max_size_cycle for validate / test / fit's validation: the batches
    (the structure, None for a loader that ran out), the hooks' arguments, the logged metrics and the results."""
    lib, base, combined = FRAMEWORKS[name]
    torch.manual_seed(0)
    rows = []

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[1]).sum()

        def _step(self, batch, batch_idx, *rest):
            rows.append(["step", batch_idx, list(rest), _indices(batch)])
            values = [float(one[0].sum()) for one in (batch["x"], batch["y"][0]) if one is not None]
            self.log("seen", sum(values), on_step=True, on_epoch=True)
            self.log("count", float(len(values)), reduce_fx="sum")

        def validation_step(self, batch, batch_idx, *rest):
            self._step(batch, batch_idx, *rest)

        def test_step(self, batch, batch_idx, *rest):
            self._step(batch, batch_idx, *rest)

        def on_validation_batch_end(self, outputs, batch, batch_idx, *rest):
            rows.append(["batch end", batch_idx, list(rest)])

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    logged = []

    class Logger(lib.loggers.CSVLogger if name == "tasktrain" else pl.loggers.CSVLogger):
        def log_metrics(self, metrics, step=None):
            logged.append([step, {k: round(float(v), 4) for k, v in sorted(metrics.items())}])

    quiet = dict(QUIET, logger=Logger(kwargs.pop("save_dir")))
    trainer = lib.Trainer(max_epochs=1, enable_checkpointing=False, **quiet, **kwargs)
    loaders = combined({"x": DataLoader(_data(5, 0), batch_size=2), "y": [DataLoader(_data(3, 50), batch_size=2)]},
                       mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "fit":
            trainer.fit(Module(), DataLoader(_data(4, 0), batch_size=2), loaders)
            results = None
        else:
            results = getattr(trainer, how)(Module(), loaders, verbose=False)
    counts = trainer.num_test_batches if how == "test" else trainer.num_val_batches
    metrics = {k: round(float(v), 4) for k, v in sorted(trainer.callback_metrics.items())}
    return rows, counts, results, metrics, logged


@pytest.mark.parametrize("how, mode, kwargs", [
    ("validate", "max_size_cycle", {}),  # y (2 batches) starts again for x's third
    ("validate", "max_size", {}),  # y gives None at x's third
    ("test", "min_size", {}),
    ("validate", "max_size_cycle", {"limit_val_batches": 1}),
    ("fit", "max_size", {"num_sanity_val_steps": 1, "limit_train_batches": 1}),  # the sanity check's limit too
])
def test_evaluation_of_a_combined_loader_is_lightnings(how, mode, kwargs, tmp_path):
    theirs = _evaluate_together("lightning", how, mode, save_dir=str(tmp_path / "l"), **dict(kwargs))
    mine = _evaluate_together("tasktrain", how, mode, save_dir=str(tmp_path / "t"), **dict(kwargs))
    assert mine == theirs
    rows = [row for row in mine[0] if row[0] == "step"]
    assert all(row[2] == [] for row in mine[0])  # no dataloader_idx for the step and hooks
    if how == "validate" and not kwargs:
        assert [row[3] for row in rows] == [{"x": [0, 1], "y": [[50, 51]]}, {"x": [2, 3], "y": [[52]]},
                                            {"x": [4], "y": [[50, 51] if mode == "max_size_cycle" else None]}]
        assert mine[1] == [3, 2] and len(mine[2]) == 1 and mine[2][0]["count"] == 6 - (mode == "max_size")


def test_evaluation_refuses_the_other_modes():
    # Lightning predicts in sequential mode only, and says so
    said, _ = _evaluate("tasktrain", "predict", "max_size_cycle")
    assert "only supports the `CombinedLoader(mode=\"sequential\")` mode" in said


class _Counter(torch.utils.data.IterableDataset):
    """An order of its own with a state (where it is): what a StatefulDataLoader saves and loads back."""

    def __init__(self, read):
        self.next, self.read = None, read

    def __iter__(self):
        start, self.next = (0 if self.next is None else self.next), None
        for i in range(start, 10):
            self.next = i + 1
            self.read.append(i)
            yield torch.tensor(i), torch.full((3,), float(i)), torch.zeros(1)
        self.next = None

    def __len__(self):
        return 10

    def state_dict(self):
        return {"next": self.next}

    def load_state_dict(self, state):
        self.next = state["next"]


def _fit_stateful(name, saves=None, ckpt_path=None):
    """A combined fit (max_size_cycle) whose longer loader is a StatefulDataLoader: the batches trained on, the
    weights, and the items its data set read."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    lib, base, _ = FRAMEWORKS[name]
    torch.manual_seed(0)
    rows, read = [], []

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            rows.append([batch_idx, _indices(batch)])
            return sum(_losses(self.layer, batch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    callbacks = [lib.callbacks.ModelCheckpoint(dirpath=saves, every_n_train_steps=1, save_top_k=-1,
                                               filename="{step}")] if saves else []
    trainer = lib.Trainer(max_epochs=1, callbacks=callbacks, enable_checkpointing=bool(saves), **QUIET)
    loaders = {"a": StatefulDataLoader(_Counter(read), batch_size=2), "b": DataLoader(_data(4, 100), batch_size=2)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Module(), loaders, ckpt_path=ckpt_path)
    return rows, [round(v, 6) for p in trainer.lightning_module.parameters() for v in p.detach().flatten().tolist()] \
        if name == "lightning" else [round(v, 6) for p in trainer.module.parameters() for v in
                                     p.detach().flatten().tolist()], read


def test_a_stateful_inner_loader_resumes_from_its_state(tmp_path):
    pytest.importorskip("torchdata.stateful_dataloader")
    whole = _fit_stateful("tasktrain", saves=str(tmp_path / "t"))
    theirs = _fit_stateful("lightning", saves=str(tmp_path / "l"))
    assert whole[0] == theirs[0] and len(whole[0]) == 5
    for step in (2, 3):  # 2: b (2 batches) starts again at the resumed batch; 3: in b's second pass
        mine = _fit_stateful("tasktrain", ckpt_path=str(tmp_path / "t" / f"step={step}.ckpt"))
        # exact: the batches an uninterrupted run takes next, the same weights
        assert mine[0] == whole[0][step:] and mine[1] == whole[1], step
        # a from its saved state: its data set reads on from item 2 * step, nothing consumed is read again
        assert mine[2] == list(range(2 * step, 10)), step
        # Lightning resumes a StatefulDataLoader from its state too: a's batches are its own (b starts again there)
        again = _fit_stateful("lightning", ckpt_path=str(tmp_path / "l" / f"step={step}.ckpt"))
        assert [row[1]["a"] for row in again[0]] == [row[1]["a"] for row in mine[0]] and again[2] == mine[2], step


def _loader_attributes(name, how, given):
    """trainer.val_dataloaders / test_dataloaders / predict_dataloaders at the run's start hook and after it, as the
    lengths of the loaders in the structure the attribute has."""
    lib, base, combined = FRAMEWORKS[name]
    seen = []

    def shape(value):
        if isinstance(value, (list, tuple)):
            return type(value).__name__, [shape(one) for one in value]
        if isinstance(value, dict):
            return {key: shape(one) for key, one in value.items()}
        return "loader", len(value)

    attribute = {"fit": "val_dataloaders", "validate": "val_dataloaders"}.get(how, f"{how}_dataloaders")

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[1]).sum()

        def validation_step(self, batch, batch_idx, *rest):
            pass

        def test_step(self, batch, batch_idx, *rest):
            pass

        def predict_step(self, batch, batch_idx, *rest):
            return 0

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def _record(self):
            seen.append(shape(getattr(self.trainer, attribute)))

        on_validation_start = on_test_start = on_predict_start = _record

    trainer = lib.Trainer(max_epochs=1, limit_train_batches=1, num_sanity_val_steps=0, enable_checkpointing=False,
                          **QUIET)
    loaders = given(combined)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if how == "fit":
            trainer.fit(Module(), DataLoader(_data(4, 0), batch_size=2), loaders)
        elif how == "predict":
            trainer.predict(Module(), loaders)
        else:
            getattr(trainer, how)(Module(), loaders, verbose=False)
    return seen + [shape(getattr(trainer, attribute))]


def _loader(n):
    return DataLoader(_data(n, 0), batch_size=2)


@pytest.mark.parametrize("how, given", [
    ("fit", lambda combined: {"a": _loader(4), "b": [_loader(6), _loader(2)]}),  # a nested dict: the same dict
    ("validate", lambda combined: combined({"a": _loader(4), "b": [_loader(6)]}, "max_size")),  # its iterables
    ("test", lambda combined: [_loader(4)]),  # a list of one stays a list
    ("test", lambda combined: (_loader(4), _loader(6))),  # a tuple a tuple
    ("predict", lambda combined: combined({"a": _loader(4), "b": _loader(6)}, "sequential")),
])
def test_the_evaluation_loaders_attribute_has_the_structure_given_as_lightnings(how, given):
    """Lightning's trainer.val_dataloaders (test_dataloaders, predict_dataloaders) is its combined loader's
    `iterables`: the loaders in the structure they were given (a CombinedLoader's iterables in any mode, a dict, a
    list of one), not a flat list."""
    theirs, ours = _loader_attributes("lightning", how, given), _loader_attributes("tasktrain", how, given)
    assert ours == theirs
    assert ours[0] == ours[-1]
    if how == "fit":
        assert ours[0] == {"a": ("loader", 2), "b": ("list", [("loader", 3), ("loader", 1)])}
    elif how == "test":
        assert ours[0][0] in ("list", "tuple")
