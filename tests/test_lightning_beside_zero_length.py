"""allow_zero_length_dataloader_with_multiple_devices beside Lightning (issue 37): the attribute on every module and
DataModule, and the decision on a training loader that has no batch on this rank of two, with the all-reduce's input
faked (what the other rank has): Lightning's has_len_all_ranks and tasktrain's check give the same error or warning,
except where both ranks have none (Lightning warns; tasktrain's empty-loader rule, issue 38, refuses)."""
import warnings
from types import SimpleNamespace

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.utilities.data import has_len_all_ranks  # noqa: E402

import tasktrain  # noqa: E402
from tasktrain.demos.boring_classes import BoringModel  # noqa: E402
from tasktrain.trainer import guards, loaders  # noqa: E402


def test_the_attribute_is_set_on_every_instance_as_lightnings():
    from lightning.pytorch.demos.boring_classes import BoringModel as TheirModel

    for module in (TheirModel(), BoringModel(), pl.LightningDataModule(), tasktrain.DataModule()):
        assert vars(module)["allow_zero_length_dataloader_with_multiple_devices"] is False


class OtherRank:
    """A strategy of two ranks whose reduce adds what the other rank sends (`other`, the same layout as ours)."""

    def __init__(self, other):
        self.other, self.root_device = other, torch.device("cpu")

    def reduce(self, tensor, op=None, reduce_op=None):
        return tensor + torch.tensor(self.other, dtype=tensor.dtype)


def outcome(call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            call()
        except (RuntimeError, ValueError) as error:
            return type(error).__name__, str(error).split(" Please")[0]
    return "warned" if any("zero" in str(w.message) for w in seen) else "ok"


@pytest.mark.parametrize("allowed", [False, True])
@pytest.mark.parametrize("local,other", [(0, 3), (2, 0), (2, 3), (0, 0)])
def test_a_rank_without_batches_decided_as_lightning(local, other, allowed, monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # (the faked reduce is the group)
    theirs = outcome(lambda: has_len_all_ranks(
        torch.utils.data.DataLoader(range(local)), OtherRank(other), allowed))
    module = BoringModel()
    module.allow_zero_length_dataloader_with_multiple_devices = allowed
    trainer = SimpleNamespace(world_size=2, is_global_zero=True, module=module, datamodule=None,
                              strategy=OtherRank([other, int(other == 0)]))
    ours = outcome(lambda: guards.check_training_batches(loaders.train_length(trainer, local, "DataLoader"), None))
    if local == other == 0:  # Lightning warns and trains nothing; tasktrain's empty training loader is an error
        assert theirs == "warned" and ours[0] == "ValueError"
    elif local == 0 and other and not allowed:  # ours says every rank's count and how to allow it
        assert ours == theirs == ("RuntimeError", "`DataLoader` within local rank has zero length.")
    elif other == 0 and local:  # the other rank is the empty one: every rank gets its outcome (Lightning's ranks
        # with batches go on and wait for the one that raised)
        empty_rank = outcome(lambda: has_len_all_ranks(torch.utils.data.DataLoader([]), OtherRank(local), allowed))
        assert ours == empty_rank != theirs == "ok"
    else:
        assert ours == theirs
    # ... and a DataModule's attribute allows it too, as Lightning's loops read it
    module.allow_zero_length_dataloader_with_multiple_devices = False
    trainer.datamodule = tasktrain.DataModule()
    trainer.datamodule.allow_zero_length_dataloader_with_multiple_devices = allowed
    assert outcome(lambda: guards.check_training_batches(
        loaders.train_length(trainer, local, "DataLoader"), None)) == ours
