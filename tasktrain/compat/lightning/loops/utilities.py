"""Lightning's `lightning.pytorch.loops.utilities` (tasktrain.loops.utilities): `_no_grad_context`, the decorator of a
loop's run that picks its grad mode, applying tasktrain's rule for evaluation runs (evaluation.inference_or_no_grad:
torch.inference_mode where the loop's `inference_mode` asks for it, torch.no_grad otherwise and always on gloo).
(Lightning's also picks no_grad for its XLA accelerator, its FSDP strategy and a compiled module: tasktrain's
evaluation runs under FSDP run their steps under no_grad in the strategy, and tasktrain has no XLA.)"""
import functools

from tasktrain.compat.lightning.loops import _Loop
from tasktrain.trainer.evaluation import inference_or_no_grad


def _no_grad_context(loop_run):
    @functools.wraps(loop_run)
    def run(self, *args, **kwargs):
        if not isinstance(self, _Loop):  # (Lightning's checks and words)
            raise TypeError(f"`{type(self).__name__}` needs to be a Loop.")
        if not hasattr(self, "inference_mode"):
            raise TypeError(f"`{type(self).__name__}.inference_mode` needs to be defined")
        with inference_or_no_grad(self.inference_mode, self.trainer.strategy):
            return loop_run(self, *args, **kwargs)

    return run
