"""The default predict_step beside Lightning 2.6 (issue 37): with no predict_step of its own, a module's forward gets
the whole batch, self(batch), as Lightning's LightningModule.predict_step gives it; a loader of (x, y) pairs gives
forward the pair (tasktrain once unwrapped it to batch[0]). The calling forms Lightning's *args, **kwargs take give
the same result."""
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("lightning.pytorch")

import tasktrain  # noqa: E402

QUIET = dict(logger=False, enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
             accelerator="cpu", devices=1)


def _pairs():
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(10, 4, generator=generator), torch.randn(10, 1, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4)


def _module(lib):
    class WholeBatch(lib.LightningModule if lib is pl else lib.TaskModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, batch):  # the whole batch, as a Lightning user writes it: (x, y)
            x, y = batch
            return torch.cat([self.layer(x), y], dim=1)

    return WholeBatch()


def _predict(lib):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return lib.Trainer(**QUIET).predict(_module(lib), _pairs())


def test_the_default_predict_step_gives_forward_the_whole_batch_as_under_lightning():
    mine, lightning = _predict(tasktrain), _predict(pl)
    assert [tuple(p.shape) for p in mine] == [tuple(p.shape) for p in lightning] == [(4, 2), (4, 2), (2, 2)]
    for ours_batch, theirs_batch in zip(mine, lightning):
        torch.testing.assert_close(ours_batch, theirs_batch)
    # the second column is y: forward got the pair, not x alone
    torch.testing.assert_close(torch.cat(mine)[:, 1:], _pairs().dataset.tensors[1])


@pytest.mark.parametrize("form", ["batch", "batch, batch_idx", "batch, batch_idx, dataloader_idx",
                                  "batch, batch_idx=", "other, batch="])
def test_the_default_predict_step_takes_lightnings_calling_forms(form):
    batch = next(iter(_pairs()))
    other = (torch.zeros(4, 4), torch.zeros(4, 1))
    calls = {"batch": lambda m: m.predict_step(batch),
             "batch, batch_idx": lambda m: m.predict_step(batch, 0),
             "batch, batch_idx, dataloader_idx": lambda m: m.predict_step(batch, 0, 1),
             "batch, batch_idx=": lambda m: m.predict_step(batch, batch_idx=0),
             "other, batch=": lambda m: m.predict_step(other, batch=batch)}  # batch= wins, as Lightning's
    torch.testing.assert_close(calls[form](_module(tasktrain)), calls[form](_module(pl)))


def test_the_batch_may_be_given_by_name_alone():
    """Lightning's default evaluates args[0] before looking at batch=, so predict_step(batch=...) alone is its
    IndexError; tasktrain takes the batch (docs/lightning.md), and no batch at all is a TypeError saying so."""
    batch = next(iter(_pairs()))
    torch.testing.assert_close(_module(tasktrain).predict_step(batch=batch), _module(pl).predict_step(batch, 0))
    with pytest.raises(IndexError):
        _module(pl).predict_step(batch=batch)
    with pytest.raises(TypeError, match=r"predict_step\(\) got no batch: pass it first"):
        _module(tasktrain).predict_step()
