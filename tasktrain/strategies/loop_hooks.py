"""Lightning 2.6's loop-facing Strategy methods, on every tasktrain strategy (Strategy inherits LoopHooks).

Lightning's Trainer and loops call these on their strategy; a Lightning user overrides them in a subclass of
SingleDeviceStrategy, DDPStrategy, ... Each one here is either called by tasktrain's Trainer where Lightning's calls it,
with Lightning's arguments and Lightning's default (CALLED), or refused before the run when a subclass overrides it
(REFUSED: check_loop_overrides raises a NotImplementedError that names the method, why, and what to override instead):
an override is never silently ignored. The Trainer's call sites are tasktrain/trainer/strategy_hooks.py's helpers.

A method counts as overridden when a class outside tasktrain defines it, or the instance holds its own (a mock).
"""


class LoopHooks:
    """Lightning's loop-facing Strategy API with Lightning's defaults (docs/lightning.md, Strategies)."""

    # -- set-up ------------------------------------------------------------------------------------------------------
    def setup(self, trainer):
        """Lightning's strategy.setup(trainer): set up the module (and, when fitting, configure_optimizers and the
        optimizers) for the run; called by the Trainer after the module's configure_model (and the checkpoint's
        module part, unless restore_checkpoint_after_setup), before on_fit_start. An override must call
        super().setup(trainer), which runs tasktrain's set-up (the engine's wrap, the precision's cast, the move)."""
        set_up = getattr(trainer, "_pending_strategy_setup", None)
        if set_up is None:
            raise RuntimeError(f"{type(self).__name__}.setup(trainer) is called by the Trainer when a run starts "
                               "(trainer.fit / validate / test / predict), not by a script.")
        trainer._pending_strategy_setup = None
        set_up()

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Whether the module's and callbacks' part of a checkpoint is read after setup(trainer) (and on_fit_start)
        rather than before it (Lightning's). Default: True for an engine that shards the module (DeepSpeed, FSDP,
        ModelParallel: they read a checkpoint into what they set up), else False."""
        from tasktrain.strategies.base import Sharded

        return isinstance(self, Sharded)

    @property
    def lightning_restore_optimizer(self) -> bool:
        """Whether a resumed fit restores the optimizers' states (through load_optimizer_state_dict); False leaves
        them to the strategy (the schedulers are restored either way: Lightning's). Default: True."""
        return True

    @property
    def handles_gradient_accumulation(self) -> bool:
        """Lightning's: whether the strategy accumulates gradients itself. tasktrain's loop tells each strategy its
        accumulation window (the plan); an override is refused (REFUSED). Default: False."""
        return False

    # -- checkpoints ---------------------------------------------------------------------------------------------------
    def load_model_state_dict(self, checkpoint, strict: bool = True):
        """Load the checkpoint's module weights (checkpoint["state_dict"]) into the module (Lightning's); the Trainer
        calls it with strict=module.strict_loading when it restores a checkpoint. Default: through the strategy's
        own load (an engine reads into its shards)."""
        set_up = self.model is not None and self.model is not self.module
        self.load_module_state_dict(checkpoint["state_dict"], None if set_up else self.lightning_module, strict=strict)

    def load_optimizer_state_dict(self, checkpoint):
        """Load checkpoint["optimizer_states"] into the strategy's optimizers, in order (Lightning's); called when a
        resumed fit restores them (lightning_restore_optimizer)."""
        for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
            self.load_optimizer_state(optimizer, state)

    # -- stages (Lightning's _call_strategy_hook points: after the callbacks' and the module's hook) ------------------
    def on_train_start(self):
        """Called when training starts, after the callbacks' and the module's on_train_start."""

    def on_train_end(self):
        """Called when training ends, after the callbacks' and the module's on_train_end."""

    def on_validation_start(self):
        """Called when a validation (in a fit too) starts, after the callbacks' and the module's hook."""

    def on_validation_end(self):
        """Called when a validation ends, after the callbacks' and the module's hook."""

    def on_test_start(self):
        """Called when a test starts, after the callbacks' and the module's hook."""

    def on_test_end(self):
        """Called when a test ends, after the callbacks' and the module's hook."""

    def on_predict_start(self):
        """Called when a prediction starts, after the callbacks' and the module's hook."""

    def on_predict_end(self):
        """Called when a prediction ends, after the callbacks' and the module's hook."""

    def on_train_batch_start(self, batch, batch_idx):
        """Called before each training batch, after the callbacks' and the module's on_train_batch_start (what it
        returns is not read: the module's -1 ends the epoch)."""

    def process_dataloader(self, dataloader):
        """Each loader of a run, before it is read (Lightning's: the one returned is the one read). Default: as
        it is."""
        return dataloader

    # -- steps ---------------------------------------------------------------------------------------------------------
    def post_training_step(self):
        """Called after each training_step (Lightning's deprecated hook, still called)."""

    def pre_backward(self, closure_loss):
        """Called before each backward of the loop (and of manual_backward), with the loss."""

    def post_backward(self, closure_loss):
        """Called after each backward of the loop (and of manual_backward), with the loss."""

    # -- refused when overridden (REFUSED says why); callable, with Lightning's meaning where it has one -------------
    def setup_distributed(self):
        raise NotImplementedError(_refusal(self, "setup_distributed"))

    def configure_ddp(self):
        raise NotImplementedError(_refusal(self, "configure_ddp"))

    def determine_ddp_device_ids(self):
        """Lightning's DDP: the device ids DistributedDataParallel gets (None on the CPU)."""
        return None if self.root_device.type == "cpu" else [self.root_device.index]

    def init_deepspeed(self):
        raise NotImplementedError(_refusal(self, "init_deepspeed"))

    def setup_optimizers(self, trainer):
        raise NotImplementedError(_refusal(self, "setup_optimizers"))

    def setup_precision_plugin(self):
        raise NotImplementedError(_refusal(self, "setup_precision_plugin"))

    def model_to_device(self):
        """Move the module to root_device (Lightning's default)."""
        if self.lightning_module is not None:
            self.lightning_module.to(self.root_device)


_SETUP = ("tasktrain's Trainer sets the strategy up in one call to its engine (setup_module_and_optimizers: the "
          "precision's cast, the move, the wrapper, the optimizers), so this step of Lightning's set-up is not a "
          "method of its own")
REFUSED = {
    "setup_distributed": ("the process group and device are set up by setup_environment() (tasktrain's launcher "
                          "and world)", "setup_environment() (call super().setup_environment())"),
    "configure_ddp": (_SETUP + " (DDP's wrapper is built inside it)",
                      "setup(trainer) (call super().setup(trainer); strategy.model is the wrapped module after it), "
                      "or DDPStrategy's arguments (find_unused_parameters=, static_graph=, ...)"),
    "determine_ddp_device_ids": ("tasktrain's DDP gives DistributedDataParallel the rank's device itself",
                                 "CUDA_VISIBLE_DEVICES or the Trainer's devices="),
    "init_deepspeed": (_SETUP + " (deepspeed.initialize runs inside it)",
                       "setup(trainer) (call super().setup(trainer)), or DeepSpeedStrategy(config=...)"),
    "setup_optimizers": (_SETUP + " (configure_optimizers is read there)",
                         "the module's configure_optimizers, or setup(trainer) (call super().setup(trainer); "
                         "strategy.optimizers are set up after it)"),
    "setup_precision_plugin": (_SETUP + " (the precision plugin connects there)",
                               "setup(trainer) (call super().setup(trainer)), or a precision plugin of your own in "
                               "plugins=[...]"),
    "model_to_device": (_SETUP + " (the module moves there)",
                        "setup(trainer) (call super().setup(trainer))"),
    "handles_gradient_accumulation": ("tasktrain's loop gives every strategy its accumulation window "
                                      "(accumulate_grad_batches) and the engine (DeepSpeed) accumulates by it",
                                      "Trainer(accumulate_grad_batches=...)"),
}
CALLED = ("setup", "restore_checkpoint_after_setup", "lightning_restore_optimizer", "load_model_state_dict",
          "load_optimizer_state_dict", "on_train_start", "on_train_end", "on_validation_start", "on_validation_end",
          "on_test_start", "on_test_end", "on_predict_start", "on_predict_end", "on_train_batch_start",
          "process_dataloader", "post_training_step", "pre_backward", "post_backward")
# (validation_step, test_step, predict_step and training_step are the Strategy contract's own: base.py; the loops
# call them for every batch)


def _refusal(strategy, name):
    why, instead = REFUSED[name]
    return (f"{type(strategy).__name__}.{name}: {why}; tasktrain's Trainer does not call it. Override {instead} "
            "instead (docs/lightning.md, Strategies).")


def overrides(strategy, name) -> bool:
    """Whether a subclass of one's own (a class outside tasktrain) or the instance itself defines `name`."""
    if name in vars(strategy):
        return True
    for cls in type(strategy).__mro__:
        if name in vars(cls):
            return not cls.__module__.startswith("tasktrain.")
    return False


def check_loop_overrides(strategy):
    """Before a run: an override of a method tasktrain's Trainer cannot call is an error naming it, why, and what to
    override instead."""
    for name in REFUSED:
        if overrides(strategy, name):
            raise NotImplementedError(_refusal(strategy, name))

