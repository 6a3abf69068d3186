"""SpikeDetection on two real processes (ddp_spawn, gloo on 127.0.0.1): each rank judges its own loss, and a spike on
one rank stops every rank. Apart from the Lightning comparisons (tests/test_lightning_beside_more_callbacks.py) so
that the spawned processes, which import this file, do not import Lightning."""
import json

import pytest
import torch
from torch.utils.data import DataLoader

import tasktrain
import tasktrain.callbacks

QUIET = dict(logger=False, enable_progress_bar=False, enable_checkpointing=False, enable_model_summary=False,
             num_sanity_val_steps=0, accelerator="cpu")


class RankSpike(tasktrain.TaskModule):
    """Loss 1/(batch+1), except on global rank 1 at batch 4 (a spike only that rank sees). At module level: pickled
    for ddp_spawn."""

    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1, bias=False)

    def training_step(self, batch, batch_idx):
        with torch.no_grad():
            self.layer.weight.fill_(1.0)
        value = 100.0 if (self.global_rank == 1 and batch_idx == 4) else 1 / (batch_idx + 1)
        return self.layer(torch.tensor([[value]])).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


@pytest.mark.world_size(2)
@pytest.mark.timeout(120)
def test_spike_on_one_rank_stops_every_rank_and_rank_zero_writes_the_file(tmp_path):
    """Two real processes (ddp_spawn, gloo): only rank 1's loss spikes; rank 0 still stops at that batch (it writes
    the file only from inside the spike handling), and the fit fails with the spike."""
    callback = tasktrain.callbacks.SpikeDetection(exclude_batches_path=tmp_path)
    trainer = tasktrain.Trainer(**QUIET, devices=2, strategy="ddp_spawn", max_epochs=1,
                                default_root_dir=tmp_path, callbacks=[callback])
    with pytest.raises(Exception, match="Training spike detected in batch 4"):
        trainer.fit(RankSpike(), DataLoader([1.0] * 16))
    with open(tmp_path / "skip_batches.json") as f:
        assert json.load(f) == [3, 4]
