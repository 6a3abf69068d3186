"""The results table validate / test print (verbose=True), beside Lightning 2.6 itself (a test-only dependency,
never imported by the package): the same module and loaders run under both, and stdout must be equal, character for
character, with rich installed and without it (each framework's availability flag pinned)."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

L = pytest.importorskip("lightning.pytorch")
evaluation_loop = pytest.importorskip("lightning.pytorch.loops.evaluation_loop")

import tasktrain  # noqa: E402
from tasktrain.callbacks import progress  # noqa: E402


def _module(base):
    class Scored(base):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def _step(self, prefix, batch, dataloader_idx):
            loss = torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])
            self.log(f"{prefix}_loss", loss)
            self.log(f"{prefix}_count", 3)  # an int: printed as the float it is logged as
            if dataloader_idx == 1:  # a name only the second loader logs: blank in the first column
                self.log(f"{prefix}_only_second", loss * 2)
            self.log(f"{prefix}_hidden", 1.0, logger=False)  # not a logged output: not in the table

        def validation_step(self, batch, batch_idx, dataloader_idx=0):
            self._step("val", batch, dataloader_idx)

        def test_step(self, batch, batch_idx, dataloader_idx=0):
            self._step("test", batch, dataloader_idx)

        def on_test_epoch_end(self):
            self.log("a_metric_whose_name_is_far_longer_than_half_of_the_terminal_width_of_120_columns", 0.5)

    return Scored()


def _loader(n, seed):
    g = torch.Generator().manual_seed(seed)
    return DataLoader(TensorDataset(torch.randn(n, 4, generator=g), torch.randn(n, 1, generator=g)), batch_size=4)


def _printed(pkg, base, tmp_path, capsys, verbose=True):
    torch.manual_seed(0)
    module = _module(base)
    trainer = pkg.Trainer(enable_progress_bar=False, enable_model_summary=False, logger=False,
                          enable_checkpointing=False, default_root_dir=str(tmp_path))
    capsys.readouterr()
    said = []
    for run, loaders in [(trainer.validate, _loader(8, 1)), (trainer.validate, [_loader(8, 1), _loader(12, 2)]),
                         (trainer.test, _loader(8, 3)), (trainer.test, [_loader(8, 3), _loader(4, 4)])]:
        returned = run(module, loaders, verbose=verbose)
        said.append((capsys.readouterr().out, returned))
    return said


@pytest.mark.parametrize("rich", [True, False])
def test_results_table_as_lightning(rich, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(evaluation_loop, "_RICH_AVAILABLE", rich)
    monkeypatch.setattr(progress, "rich_available", lambda: rich)
    monkeypatch.setattr(tasktrain.Trainer, "_announced", True, raising=False)  # the one-time banner, not compared
    expected = _printed(L, L.LightningModule, tmp_path / "pl", capsys)
    got = _printed(tasktrain, tasktrain.TaskModule, tmp_path / "tt", capsys)
    for (want_out, want_returned), (out, returned) in zip(expected, got):
        assert "DataLoader 0" in want_out and ("Validate metric" in want_out or "Test metric" in want_out)
        assert ("┃" in want_out) == rich  # the branch pinned is the one that ran
        assert out == want_out
        assert returned == want_returned  # (the same values, as the table shows them)


def test_not_verbose_prints_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tasktrain.Trainer, "_announced", True, raising=False)
    for out, returned in _printed(tasktrain, tasktrain.TaskModule, tmp_path, capsys, verbose=False):
        assert out == "" and returned and returned[0]
