from tasktrain.callbacks.base import Callback
from tasktrain.strategies.base import GradientClip


class GradientClipping(Callback):
    """Clip gradients after unscaling and before the optimizer step; optionally log the pre-clip norm.

    The training step calls `clip` once per optimizer step, after on_before_optimizer_step (the accumulation
    window's gradients are complete; Lightning's place for clipping), through `strategy.clip_gradients`: fp16 gradients are unscaled first, so the bounds apply to the
    true gradients. max_norm scales all gradients to a total `norm_type`-norm of at most max_norm; max_value
    clamps each element (both may be given: the norm first). log_norm=True logs the total norm measured before
    clipping as "grad_norm" (a tensor: read only when a logger writes it).

    The Trainer tells the strategy what it will ask for (`requests`, in the plan of setup_module_and_optimizers):
    an engine that clips inside its own step (DeepSpeed) is set up with it, and its clip_gradients then only checks.
    """

    def __init__(self, max_norm=None, max_value=None, norm_type=2.0, log_norm=False):
        if max_norm is None and max_value is None and not log_norm:
            raise ValueError("GradientClipping needs max_norm, max_value, or log_norm=True.")
        for name, value in (("max_norm", max_norm), ("max_value", max_value)):
            if value is not None and value <= 0:
                raise ValueError(f"GradientClipping({name}={value}): use a positive number.")
        self.max_norm, self.max_value, self.norm_type, self.log_norm = max_norm, max_value, float(norm_type), log_norm
        self.from_trainer = False  # Trainer(gradient_clip_val=...) made it: a module's configure_gradient_clipping
        #                            then clips in its place, with that value (Lightning's rule)

    @property
    def state_key(self):
        return self._generate_state_key(max_norm=self.max_norm, max_value=self.max_value, norm_type=self.norm_type)

    @property
    def requests(self):
        """The clipping this callback asks for at every optimizer step, as the plan records it."""
        out = []
        if self.max_norm is not None:
            out.append(GradientClip(float(self.max_norm), "norm", self.norm_type,
                                    f"GradientClipping(max_norm={self.max_norm})"))
        if self.max_value is not None:
            out.append(GradientClip(float(self.max_value), "value", self.norm_type,
                                    f"GradientClipping(max_value={self.max_value})"))
        return tuple(out)

    def clip(self, trainer, module, optimizer):
        """Called by the training step (tasktrain/trainer/loop.py, clip_gradients) at each optimizer step."""
        norm = trainer.strategy.clip_gradients(optimizer, self.max_norm, self.max_value, self.norm_type)
        if self.log_norm and norm is not None:
            module.log("grad_norm", norm, on_step=True, on_epoch=False)
