"""Helper for tests/test_lightning_beside_ddp_order.py (run by beside_lightning_ddp.py, or alone under torchrun with 2
processes): the same fits over a
sequential DataLoader (shuffle=False) under Lightning's DDP, then under tasktrain's in the same process group, with
and without seed_everything and with overfit_batches, and over loaders of the user's own order (CASES: custom sampler,
custom batch sampler, RandomSampler with replacement; with validation and prediction; a DataLoader subclass with
an argument of its own, built in the hooks; a StatefulDataLoader(shuffle=True)), over two training
loaders in a dict (each sharded), a validate over a CombinedLoader(mode="max_size_cycle"), then tasktrain's fits resumed
from the middle of an epoch; each rank writes OUT/rank{R}.json with, per fit, the sample indices of every batch it
trained on ((epoch, batch_idx) order) and the weights after (and the validation's and prediction's batches and the
set_epoch calls the user's samplers got). Last, under both, a fit whose every rank gets SIGTERM at the same batch
(as torchrun and SLURM signal every process; issue 37): the hooks it saw, how the fit ended, and what
ModelCheckpoint(save_on_exception=True) saved.

    torchrun --standalone --nproc_per_node 2 order_beside_lightning.py OUT
"""
import gc
import json
import os
import signal
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers import EpochSampler, MyBatchSampler  # noqa: E402

torch.set_num_threads(1)
warnings.filterwarnings("ignore")
SEED_VARS = ("PL_GLOBAL_SEED", "PL_SEED_WORKERS", "TASKTRAIN_GLOBAL_SEED", "TASKTRAIN_SEED_WORKERS")
CASES = {"no seed": dict(seed=None), "seed 7": dict(seed=7), "overfit": dict(seed=None, overfit_batches=2),
         "combined": dict(seed=None, combined=True)}


def custom_sampler(calls):  # (train: DistributedSamplerWrapper; val: the same, unshuffled; predict: unrepeated)
    return dict(train=DataLoader(data(), batch_size=2, sampler=EpochSampler(22, calls["train"])),
                val=DataLoader(data(), batch_size=2, sampler=EpochSampler(7, calls["val"])),
                predict=DataLoader(data(), batch_size=2, sampler=EpochSampler(7, calls["predict"])))


def custom_batch_sampler(calls):  # (its sampler is replaced by DistributedSampler(dataset): never set_epoch)
    return dict(train=DataLoader(data(), batch_sampler=MyBatchSampler(EpochSampler(22, calls["train"]), 3, False)),
                val=DataLoader(data(), batch_sampler=MyBatchSampler(EpochSampler(5, calls["val"]), 2, False)),
                predict=DataLoader(data(), batch_sampler=MyBatchSampler(EpochSampler(5, calls["predict"]), 2, True)))


def replacement(calls):  # (RandomSampler(replacement=True, num_samples): DistributedSampler(dataset))
    return dict(train=DataLoader(data(), batch_size=2, sampler=RandomSampler(range(22), True, num_samples=8)))


def stateful_custom_sampler(calls):  # (a StatefulDataLoader: rebuilt as one around DistributedSamplerWrapper)
    from torchdata.stateful_dataloader import StatefulDataLoader

    return dict(train=StatefulDataLoader(data(), batch_size=2, sampler=EpochSampler(22, calls["train"])))


def stateful_shuffle(calls):  # (a StatefulDataLoader(shuffle=True): Lightning wraps its torchdata RandomSampler)
    from torchdata.stateful_dataloader import StatefulDataLoader

    return dict(train=StatefulDataLoader(data(), batch_size=2, shuffle=True))


class TaggedLoader(DataLoader):
    """A DataLoader subclass with an argument of its own that it keeps no attribute of: Lightning builds it again
    (around its DistributedSampler) from the arguments it recorded while the hook ran, as the Trainer does."""

    def __init__(self, dataset, tag, batch_size=2, **kwargs):
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        self.kind = f"tagged {tag}"


def subclass(calls):  # (built in the module's hooks: train shuffled, val and predict in order)
    return dict(train=TaggedLoader(data(), "train", shuffle=True), val=TaggedLoader(data(), "val"),
                predict=TaggedLoader(data(), "predict", batch_size=3), hooked=True)


CASES.update({"stateful custom sampler": dict(seed=7, loaders=stateful_custom_sampler, kinds=True),
              "subclass": dict(seed=7, loaders=subclass, kinds=True),
              "stateful shuffle": dict(seed=7, loaders=stateful_shuffle)})
CASES.update({"custom sampler": dict(seed=7, loaders=custom_sampler), "custom batch sampler":
              dict(seed=None, loaders=custom_batch_sampler), "replacement": dict(seed=None, loaders=replacement)})


def data():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(22, 3, generator=g)
    return TensorDataset(torch.arange(22), x, x @ torch.tensor([[1.0], [-2.0], [0.5]]))


def small():
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(4))
    return TensorDataset(torch.arange(100, 107), x, x @ torch.tensor([[0.5], [1.0], [-1.0]]))


def fit(lib, base, seed, overfit_batches=0, callbacks=(), ckpt_path=None, loaders=None, combined=False,
        kinds=False):
    for var in SEED_VARS:
        os.environ.pop(var, None)
    if seed is None:
        torch.manual_seed(0)  # the weights' draw; the sampler's seed is then Lightning's default, 0
    else:
        lib.seed_everything(seed, verbose=False)
    rows, val_rows, predict_rows, kinds = [], [], [], ([] if kinds else None)
    calls = {"train": [], "val": [], "predict": []}
    given = loaders(calls) if loaders is not None else {}

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            if kinds == []:  # the loader trained on (Lightning drops it after the fit), and the
                # sampler its batches come from (Lightning rebuilds a StatefulDataLoader's torchdata BatchSampler
                # around it, leaving `sampler` a SequentialSampler)
                loader = self.trainer.train_dataloader
                sampler = loader.batch_sampler.sampler
                kinds.extend([type(loader).__name__, type(sampler).__name__] if "hooked" not in given else
                             [type(loader).__name__, loader.kind, isinstance(sampler, DistributedSampler)])
            if combined:  # {"a": batch, "b": batch} of two loaders (max_size_cycle), each sharded by the strategy
                rows.append([self.current_epoch, batch_idx, {k: v[0].tolist() for k, v in batch.items()}])
                return sum(torch.nn.functional.mse_loss(self.layer(x), y) for _, x, y in batch.values())
            index, x, y = batch
            rows.append([self.current_epoch, batch_idx, index.tolist()])
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Evaluated(Module):
        def validation_step(self, batch, batch_idx):
            val_rows.append([self.trainer.sanity_checking, self.current_epoch, batch_idx, batch[0].tolist()])

        def predict_step(self, batch, batch_idx):
            predict_rows.append([batch_idx, batch[0].tolist()])

    class Hooked(Evaluated):  # (the loaders built in the hooks, each time they are requested)
        def train_dataloader(self):
            return loaders(calls)["train"]

        def val_dataloader(self):
            return loaders(calls)["val"]

        def predict_dataloader(self):
            return loaders(calls)["predict"]

    module = Hooked() if "hooked" in given else Evaluated() if "val" in given else Module()
    trainer = lib.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                          overfit_batches=overfit_batches, callbacks=list(callbacks),
                          enable_checkpointing=bool(callbacks), enable_progress_bar=False, enable_model_summary=False)
    loader = given.get("train", DataLoader(data(), batch_size=2, shuffle=False))
    if combined:
        loader = {"a": loader, "b": DataLoader(small(), batch_size=1, shuffle=True)}
    hooked = "hooked" in given
    trainer.fit(module, None if hooked else loader, None if hooked else given.get("val"), ckpt_path=ckpt_path)
    weights = [v for p in module.layer.parameters() for v in p.detach().flatten().tolist()]
    if "predict" in given:
        trainer.predict(module, None if hooked else given["predict"], return_predictions=False)
    seen = {"batches": rows, "weights": weights}
    if loaders is not None:
        seen.update(val=val_rows, predict=predict_rows, set_epoch=calls, **({} if kinds is None else {"loader": kinds}))
    if combined:  # trainer.train_dataloader: the loaders as given, each with a DistributedSampler
        seen["samplers"] = {k: isinstance(v.sampler, DistributedSampler) for k, v in trainer.train_dataloader.items()}
    del trainer
    return seen


def sigterm_fit(lib, base, sigterm_exception, folder):
    """SIGTERM to this rank at batch 2 of epoch 0 (every rank alike): what each hook saw, and how the fit ended."""
    seen = []

    class Term(lib.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            seen.append(["on_train_batch_end", batch_idx, trainer.received_sigterm])
            if (trainer.current_epoch, batch_idx) == (0, 2):
                os.kill(os.getpid(), signal.SIGTERM)

        def on_train_end(self, trainer, module):
            seen.append(["on_train_end"])

        def on_exception(self, trainer, module, exception):
            seen.append(["on_exception", type(exception).__name__, trainer.global_step, trainer.received_sigterm])

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, batch_idx):
            index, x, y = batch
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    saver = lib.callbacks.ModelCheckpoint(dirpath=folder, save_on_exception=True)  # (every rank reaches its save)
    trainer = lib.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False, log_every_n_steps=1,
                          callbacks=[Term(), saver], enable_progress_bar=False, enable_model_summary=False)
    try:
        trainer.fit(Module(), DataLoader(data(), batch_size=2, shuffle=False))
        seen.append("returned")
    except sigterm_exception:
        seen.append("SIGTERMException")
    seen.append(["after", trainer.received_sigterm, signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                 sorted(os.listdir(folder))])
    del trainer
    return seen


def validate_combined(lib, base, combined):
    """validate on a CombinedLoader(mode="max_size_cycle") of two loaders (each sharded: 6 and 2 batches a rank), a
    metric logged with sync_dist: the batches, the results, and the `DistributedSampler` warnings rank 0 gives."""
    rows = []

    class Module(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            rows.append([batch_idx, dataloader_idx, {k: v[0].tolist() for k, v in batch.items()}])
            self.log("seen", float(sum(v[0].sum() for v in batch.values())), on_epoch=True, sync_dist=True,
                     reduce_fx="sum")

    eight = TensorDataset(*(t[:8] for t in data().tensors))
    loaders = combined({"x": DataLoader(data(), batch_size=2), "y": DataLoader(eight, batch_size=2)},
                       "max_size_cycle")
    trainer = lib.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False, enable_progress_bar=False,
                          enable_model_summary=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = trainer.validate(Module(), loaders, verbose=False)
    said = [str(w.message) for w in caught if "Using `DistributedSampler`" in str(w.message)]
    del trainer
    return {"rows": rows, "results": results, "warnings": said}


def validate_steps(lib, base, samples):
    """validate over a sequential loader of `samples` numbers (batches of 2), a step value logged with sync_dist:
    the (step, value) writes every rank's logger gets (Lightning calls a logger's log_metrics on every rank)."""
    calls = []

    class Record(lib.loggers.Logger):
        name, version, experiment = "record", 0, None

        def log_metrics(self, metrics, step=None):
            calls.append([step, round(float(metrics["v"]), 4)])

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    class Module(base):
        def validation_step(self, batch, batch_idx):
            self.log("v", batch[0].sum(), on_step=True, on_epoch=False, sync_dist=True)

    trainer = lib.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=Record(), enable_progress_bar=False,
                          enable_model_summary=False)
    trainer.validate(Module(), DataLoader(TensorDataset(torch.arange(float(samples))), batch_size=2), verbose=False)
    del trainer
    return calls


def main(out, close=True):
    import lightning.pytorch as L

    import tasktrain

    seen = {}
    for name, lib, base in (("lightning", L, L.LightningModule), ("tasktrain", tasktrain, tasktrain.TaskModule)):
        seen[name] = {case: fit(lib, base, **kwargs) for case, kwargs in CASES.items()}
        combined = L.utilities.CombinedLoader if name == "lightning" else tasktrain.utilities.CombinedLoader
        seen[name + " validate combined"] = validate_combined(lib, base, combined)
        seen[name + " validate steps"] = validate_steps(lib, base, 8)
    seen["tasktrain validate steps uneven"] = validate_steps(tasktrain, tasktrain.TaskModule, 9)
    # tasktrain's exact resume of that shuffled order: a fit resumed from the middle of its first epoch (step 3 of 6)
    saves = os.path.join(out, "checkpoints")
    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=saves, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    seen["resume"] = {"whole": fit(tasktrain, tasktrain.TaskModule, None, callbacks=[saver]),
                      "resumed": fit(tasktrain, tasktrain.TaskModule, None,
                                     ckpt_path=os.path.join(saves, "step=3.ckpt"))}
    # a custom sampler's fit (DistributedSamplerWrapper) resumed mid-epoch: it reads and drops the batches trained on
    saves = os.path.join(out, "custom")
    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=saves, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    seen["resume custom"] = {"whole": fit(tasktrain, tasktrain.TaskModule, 7, callbacks=[saver],
                                          loaders=custom_sampler),
                             "resumed": fit(tasktrain, tasktrain.TaskModule, 7, loaders=custom_sampler,
                                            ckpt_path=os.path.join(saves, "step=3.ckpt"))}
    # a DataLoader subclass of the user's, built again as its class around the Trainer's sampler: it skips ahead
    saves = os.path.join(out, "subclass")
    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=saves, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    seen["resume subclass"] = {"whole": fit(tasktrain, tasktrain.TaskModule, 7, callbacks=[saver], loaders=subclass),
                               "resumed": fit(tasktrain, tasktrain.TaskModule, 7, loaders=subclass,
                                              ckpt_path=os.path.join(saves, "step=3.ckpt"))}
    # the same with a StatefulDataLoader: its own state (per rank) resumes it
    saves = os.path.join(out, "stateful")
    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=saves, every_n_train_steps=3, save_top_k=-1, filename="{step}")
    seen["resume stateful"] = {"whole": fit(tasktrain, tasktrain.TaskModule, 7, callbacks=[saver],
                                            loaders=stateful_custom_sampler),
                               "resumed": fit(tasktrain, tasktrain.TaskModule, 7, loaders=stateful_custom_sampler,
                                              ckpt_path=os.path.join(saves, "step=3.ckpt"))}
    # a StatefulDataLoader(shuffle=True) (Lightning's DistributedSamplerWrapper order) resumed in epoch 1, after its
    # sampler's generator drew epoch 0's and epoch 1's permutations
    saves = os.path.join(out, "stateful-shuffle")
    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=saves, every_n_train_steps=9, save_top_k=-1, filename="{step}")
    seen["resume stateful shuffle"] = {
        "whole": fit(tasktrain, tasktrain.TaskModule, 7, callbacks=[saver], loaders=stateful_shuffle),
        "resumed": fit(tasktrain, tasktrain.TaskModule, 7, loaders=stateful_shuffle,
                       ckpt_path=os.path.join(saves, "step=9.ckpt"))}
    from lightning.pytorch.utilities.exceptions import SIGTERMException as Theirs

    from tasktrain.utilities.exceptions import SIGTERMException as Ours

    seen["sigterm"] = {
        "lightning": sigterm_fit(L, L.LightningModule, Theirs, os.path.join(out, "sigterm-lightning")),
        "tasktrain": sigterm_fit(tasktrain, tasktrain.TaskModule, Ours, os.path.join(out, "sigterm-tasktrain"))}
    # the same over two combined loaders: a resume at step 5 (the middle of epoch 0, loader b cycled once) goes on
    # with the batch an uninterrupted run takes next
    saver = tasktrain.callbacks.ModelCheckpoint(dirpath=saves + "-combined", every_n_train_steps=5, save_top_k=-1,
                                                filename="{step}")
    seen["resume combined"] = {
        "whole": fit(tasktrain, tasktrain.TaskModule, None, callbacks=[saver], combined=True),
        "resumed": fit(tasktrain, tasktrain.TaskModule, None, combined=True,
                       ckpt_path=os.path.join(saves + "-combined", "step=5.ckpt"))}
    rank = int(os.environ["RANK"])
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(seen, f)
    if close:  # (beside_lightning_ddp.py runs the scripts in turn, and closes the group after the last)
        # Lightning made the group (tasktrain joined it): nothing that holds gloo work may outlive it, then every rank
        # closes it together (FINDINGS.md: gloo aborts at exit otherwise)
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
