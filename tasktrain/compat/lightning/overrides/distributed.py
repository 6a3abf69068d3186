"""Lightning's `lightning.pytorch.overrides.distributed` names that scripts and tests use: UnrepeatedDistributedSampler
(each sample on one rank only, no padding: for prediction and evaluation) and _IndexBatchSamplerWrapper (a batch
sampler that keeps the indices of the batches it gave out). Both are the core's classes (tasktrain/trainer/data.py,
tasktrain/trainer/loader_init.py): the Trainer's own predict loaders use them (their sampler, PredictShardSampler, is
an UnrepeatedDistributedSampler, as Lightning's UnrepeatedDistributedSamplerWrapper is), so a callback's isinstance
check of `trainer.predict_dataloaders` holds, as under Lightning. Lightning's DDP helpers of this module
(prepare_for_backward, _sync_module_states, comm hooks) are not here: tasktrain's DDP strategy does that work."""
from tasktrain.trainer.data import UnrepeatedDistributedSampler  # noqa: F401
from tasktrain.trainer.loader_init import _IndexBatchSamplerWrapper  # noqa: F401
