"""torchdata's StatefulDataLoader(shuffle=True) as the training loader on one process, beside Lightning (issue 37):
Lightning keeps the loader (its class, and the permutation its torchdata RandomSampler draws each epoch); the Trainer
builds it again as a StatefulDataLoader whose epochs read the same permutations, and a fit resumed mid-epoch reads on
exactly (the global position resumes it)."""
import warnings

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
pytest.importorskip("torchdata.stateful_dataloader")
from lightning.pytorch.demos import boring_classes as theirs  # noqa: E402
from torchdata.stateful_dataloader import StatefulDataLoader  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos import boring_classes as ours  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1)


def fit(lib, boring, seen, tmp_path=None, **kwargs):
    class Model(boring.BoringModel):
        def training_step(self, batch, batch_idx):
            seen.append(batch[:, 0].tolist())
            return super().training_step(batch, batch_idx)

    lib.seed_everything(0, verbose=False)
    data = torch.arange(8.).unsqueeze(1).repeat(1, 32)
    ckpt_path = kwargs.pop("ckpt_path", None)
    trainer = lib.Trainer(max_epochs=2, enable_checkpointing=False, default_root_dir=tmp_path, **QUIET, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(Model(), StatefulDataLoader(data, batch_size=2, shuffle=True), ckpt_path=ckpt_path)
    return trainer


def test_a_shuffling_stateful_loader_reads_lightnings_order_and_resumes_exactly(tmp_path):
    got = {}
    for name, lib, boring in (("lightning", pl, theirs), ("tasktrain", tasktrain, ours)):
        seen = []
        trainer = fit(lib, boring, seen)
        got[name] = (type(trainer.train_dataloader).__name__, seen)
    assert got["tasktrain"] == got["lightning"]
    assert got["tasktrain"][0] == "StatefulDataLoader" and len(got["tasktrain"][1]) == 8
    first = []
    trainer = fit(tasktrain, ours, first, max_steps=3)  # (stopped in the middle of the first epoch)
    trainer.save_checkpoint(tmp_path / "mid.ckpt")
    rest = []
    fit(tasktrain, ours, rest, ckpt_path=str(tmp_path / "mid.ckpt"))
    assert first + rest == got["tasktrain"][1]
