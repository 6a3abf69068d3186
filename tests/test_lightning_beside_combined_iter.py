"""`CombinedLoader`'s iter() beside Lightning 2.6's (issue 37; the yardstick's utilities/test_combined_loader.py): iter()
starts the iterables' iterators there and then (a DataLoader's workers with them), every one of them or, in sequential
mode, the first one only; and a CombinedLoader iterated once can still be pickled and copied (its length kept, read
again from a new iter()). Both frameworks' CombinedLoader on the same iterables, compared step by step."""
import copy
import pickle

import pytest
from torch.utils.data import DataLoader

pytest.importorskip("lightning.pytorch")
from lightning.pytorch.utilities import CombinedLoader as TheirCombinedLoader  # noqa: E402

from tasktrain.utilities import CombinedLoader  # noqa: E402

MODES = ["min_size", "max_size_cycle", "max_size", "sequential"]


class Counted:
    """An iterable that notes each iter() of it in `started`."""

    def __init__(self, name, values, started):
        self.name, self.values, self.started = name, values, started

    def __iter__(self):
        self.started.append(self.name)
        return iter(self.values)

    def __len__(self):
        return len(self.values)


def _iterables(started):
    return {"a": Counted("a", [1, 2, 3], started), "b": Counted("b", [10, 20], started)}


@pytest.mark.parametrize("mode", MODES)
def test_iter_starts_the_iterables_as_lightnings(mode):
    seen = []
    for cls in (TheirCombinedLoader, CombinedLoader):
        started = []
        combined = cls(_iterables(started), mode)
        iter(combined)
        at_iter = list(started)
        batches = list(combined)
        seen.append((at_iter, batches, list(started)))
    assert seen[1] == seen[0]
    assert seen[1][0] == (["a"] if mode == "sequential" else ["a", "b"])


def test_workers_of_dataloaders_start_at_iter():
    class Watched(DataLoader):
        def _get_iterator(self):
            self.active = True
            return super()._get_iterator()

    seen = []
    for cls in (TheirCombinedLoader, CombinedLoader):
        loaders = [Watched(range(4), batch_size=2), Watched(range(6), batch_size=2)]
        iter(cls(loaders, "max_size"))
        seen.append([getattr(loader, "active", False) for loader in loaders])
    assert seen == [[True, True], [True, True]]


@pytest.mark.parametrize("mode", MODES)
def test_an_iterated_combined_loader_pickles_and_copies(mode):
    seen = []
    for cls in (TheirCombinedLoader, CombinedLoader):
        combined = cls({"a": DataLoader(range(6), batch_size=2), "b": list(range(5))}, mode)
        iter(combined)
        next(combined)
        copies = [pickle.loads(pickle.dumps(combined)), copy.deepcopy(combined)]
        lengths = [len(one) for one in copies]
        again = [[repr(batch) for batch in iter(one)] for one in copies]
        seen.append((len(combined), lengths, again))
    assert seen[1] == seen[0]
