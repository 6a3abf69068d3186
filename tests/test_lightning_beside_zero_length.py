"""allow_zero_length_dataloader_with_multiple_devices beside Lightning (issue 37): the attribute on every module and
DataModule, and the decision on a training loader that has no batch on a rank of two, on each rank, with the
all-reduce's input faked (what the other rank has): Lightning's has_len_all_ranks (on the loader, then on the
CombinedLoader around it, as its fit loop) and tasktrain's check give the same warnings on each rank, and the same
error on the empty rank; except where both ranks have none (Lightning warns; tasktrain's empty-loader rule, issue 38,
refuses) and on a rank with batches beside an empty one where the flag is not set (tasktrain's raises too)."""
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
    """What a rank sees: the error (type, text up to " Please"), or the zero-length warnings it gave, in order."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            call()
        except (RuntimeError, ValueError) as error:
            return type(error).__name__, str(error).split(" Please")[0]
    return [str(w.message) for w in seen if "zero" in str(w.message)]


def lightnings(rank, lengths, allowed, monkeypatch):
    """Lightning's fit loop on this rank of two (`lengths`: this rank's batches, the other's): has_len_all_ranks on
    the DataLoader, then on the CombinedLoader around it (fit_loop.setup_data), its warnings given where
    rank_zero_only.rank is 0."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only
    from lightning.pytorch.utilities import CombinedLoader

    monkeypatch.setattr(rank_zero_only, "rank", rank)
    local, other = lengths
    loader = torch.utils.data.DataLoader(range(local))
    combined = CombinedLoader(loader, "max_size_cycle")
    with monkeypatch.context() as outside_the_group:  # (its length is known once iterated: the fit loop's fetcher
        outside_the_group.setattr(torch.distributed, "is_initialized", lambda: False)  # does it before the check)
        iter(combined)

    def fit_loop_setup():
        has_len_all_ranks(loader, OtherRank(other), allowed)
        has_len_all_ranks(combined, OtherRank(other), allowed)
    return outcome(fit_loop_setup)


def ours(rank, lengths, allowed, datamodule_allows=False):
    local, other = lengths
    module = BoringModel()
    module.allow_zero_length_dataloader_with_multiple_devices = allowed and not datamodule_allows
    datamodule = None
    if datamodule_allows:  # ... a DataModule's attribute allows it too, as Lightning's loops read it
        datamodule = tasktrain.DataModule()
        datamodule.allow_zero_length_dataloader_with_multiple_devices = allowed
    trainer = SimpleNamespace(world_size=2, is_global_zero=rank == 0, module=module, datamodule=datamodule,
                              strategy=OtherRank([other, other, int(other == 0), int(other == 0)]))
    return outcome(lambda: guards.check_training_batches(
        loaders.train_length(trainer, [("DataLoader", local)], local), None))


@pytest.mark.parametrize("allowed", [False, True])
@pytest.mark.parametrize("rank0,rank1", [(0, 3), (2, 0), (2, 3), (0, 0)])
def test_a_rank_without_batches_decided_on_each_rank_as_lightning(rank0, rank1, allowed, monkeypatch):
    """Each rank of two, with the batches each has, decides as Lightning's: the warning of an allowed uneven loader
    comes from rank 0 only where rank 0 is the empty one (for the DataLoader and the CombinedLoader around it, as
    Lightning's fit loop checks both); the error, where the flag is not set, comes from every rank (Lightning's from
    the empty one only, and its others wait for it until they are stopped); where both ranks have none, tasktrain's
    empty-loader rule (issue 38) refuses where Lightning warns and trains nothing."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)  # (the faked reduce is the group)
    for rank, lengths in ((0, (rank0, rank1)), (1, (rank1, rank0))):
        theirs = lightnings(rank, lengths, allowed, monkeypatch)
        got = ours(rank, lengths, allowed)
        assert ours(rank, lengths, allowed, datamodule_allows=True) == got
        if rank0 == rank1 == 0:
            assert theirs == (["Total length of `DataLoader` across ranks is zero. Please make sure this was your "
                               "intention.", "Total length of `CombinedLoader` across ranks is zero. Please make "
                               "sure this was your intention."] if rank == 0 else [])
            assert got[0] == "ValueError"
        elif 0 in (rank0, rank1) and not allowed and lengths[0] != 0:  # a rank with batches beside an empty one
            assert theirs == [] and got == ("RuntimeError", "`DataLoader` within local rank has zero length.")
        else:
            assert got == theirs, (rank, lengths)
    if allowed and rank0 == 0 and rank1:  # (rank 0 is the empty one: it says so, for both; rank 1 says nothing)
        assert ours(1, (rank1, rank0), allowed) == [] and ours(0, (rank0, rank1), allowed) == [
            f"Total length of `{name}` across ranks is zero, but local rank has zero length. Please be cautious of "
            "uneven batch length." for name in ("DataLoader", "CombinedLoader")]


def test_a_loader_empty_on_every_rank_beside_others_warns_as_lightning(monkeypatch):
    """Several training loaders: Lightning checks each, then the CombinedLoader: one with no batch on any rank
    beside one with batches is Lightning's warning by rank 0 (the fit goes on: issue 38's error is for a training
    loader that is empty as a whole)."""
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    for rank in (0, 1):
        trainer = SimpleNamespace(world_size=2, is_global_zero=rank == 0, module=BoringModel(), datamodule=None,
                                  strategy=OtherRank([0, 2, 2, 0, 0, 0]))
        got = outcome(lambda: loaders.train_length(trainer, [("DataLoader", 0), ("MyLoader", 2)], 2))
        assert got == (["Total length of `DataLoader` across ranks is zero. Please make sure this was your "
                        "intention."] if rank == 0 else [])
