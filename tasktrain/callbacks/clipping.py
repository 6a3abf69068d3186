from tasktrain.callbacks.base import Callback


class GradientClipping(Callback):
    """Clip gradients after unscaling and before the optimizer step; optionally log the pre-clip norm."""

    def __init__(self, max_norm=None, max_value=None, norm_type=2.0, log_norm=False):
        if max_norm is None and max_value is None and not log_norm:
            raise ValueError("GradientClipping needs max_norm, max_value, or log_norm=True.")
        for name, value in (("max_norm", max_norm), ("max_value", max_value)):
            if value is not None and value <= 0:
                raise ValueError(f"GradientClipping({name}={value}): use a positive number.")
        self.max_norm, self.max_value, self.norm_type, self.log_norm = max_norm, max_value, float(norm_type), log_norm

    @property
    def state_key(self):
        return self._generate_state_key(max_norm=self.max_norm, max_value=self.max_value, norm_type=self.norm_type)

    def on_before_optimizer_step(self, trainer, module, optimizer):
        norm = trainer.strategy.clip_gradients(optimizer, self.max_norm, self.max_value, self.norm_type)
        if self.log_norm and norm is not None:
            module.log("grad_norm", norm, on_step=True, on_epoch=False)
