"""FSDP: torch's fully sharded data parallel (FSDP2, `torch.distributed.fsdp.fully_shard`).

Each rank keeps a 1/world_size shard of every parameter, of its gradient and of the optimizer state; a wrapped
module's parameters are gathered (all-gather) just before its forward and backward and dropped again after, and
the gradients are reduce-scattered, so each rank ends a backward holding the gradient of its own shard only. The
processes, the process group and the collectives are the ProcessWorld's (world.py), as DDP's are; what differs is
how the module is wrapped, how gradients are clipped and how checkpoints are written:

- wrapping: `fully_shard` on each child module that holds parameters (or on what `wrap=` selects), then on the
  root. The parameters become DTensors (torch.distributed.tensor), and the optimizers the loop was given are
  pointed at them in place (same objects: their schedulers and the user's references stay valid).
- the Trainer calls the module's steps, not its forward: the steps are registered as FSDP forward methods
  (`register_fsdp_forward_method`), so the root's gathering and its end-of-backward work run around them. The
  Accelerator's script calls the model's own forward, which fully_shard hooks as it is.
- checkpoints: a directory written by every rank in parallel with torch.distributed.checkpoint (DCP: model and
  optimizer shards, resharded on load to any world size), plus our training state file, written under a
  temporary name and renamed. state_dict_type="full" writes one ordinary file instead (gathered on rank 0).
- precision: "32-true", "bf16-mixed" and "16-mixed" (a MixedPrecisionPolicy: half compute copies, fp32 gradient
  reduction, fp32 master shards; fp16 with a ShardedGradScaler); "bf16-true" / "16-true": the module is cast to
  half before fully_shard, so the shards, the gathered parameters, the gradient reduction and the optimizer state
  are all in half (the policy is left at the parameters' dtype). A user's own MixedPrecisionPolicy is checked
  against the precision and used as given.
- activation checkpointing: torch's composable checkpoint on the chosen submodules, before fully_shard.
"""
import contextlib
import os
import warnings
import weakref
from datetime import timedelta

import torch
import torch.distributed as dist

from tasktrain.checkpoint_io import (CheckpointError, atomic_save, compiled_state_dict, link_tree, load_checkpoint_file,
                                     load_dcp, load_plain_state_dict, plain_state_dict, replace_dir, with_own)
from tasktrain.checkpoint_io import fsync_save, stage_to_cpu  # background saves
from tasktrain.compiled import compile_forward_as, unwrap_compiled
from tasktrain.names import normalize_precision
from tasktrain.strategies.base import Sharded, step_name
from tasktrain.strategies.environment import detect_environment
from tasktrain.strategies.fsdp.checkpoint import _SHARD_KEYS, _SHARDED_MARK, STATE_FILE, _split
from tasktrain.strategies.fsdp.sharding import (_check_optimizer, _check_policy, _check_resettable,
                                                _children_with_parameters, _describe_policy, _drop_unreduced_gradients,
                                                _full, _holds_dtensors, _is_class_set, _is_sharded, _keyed_by_name,
                                                _load_from_rank0, _materialize, _on_meta, _repoint_optimizer,
                                                _shared_between, _steps_only_ids)
from tasktrain.strategies.precision import HalfPrecision, MixedPrecision, Precision, patch_forward
from tasktrain.strategies.watchdog import checked_collective
from tasktrain.strategies.parallel import ParallelStrategy

_STEP_METHODS = ("training_step", "validation_step", "test_step", "predict_step")
_PRECISIONS = ("32-true", "bf16-mixed", "16-mixed", "bf16-true", "16-true")


class FSDPPrecision(MixedPrecision):
    """The mixed modes under FSDP: FSDP keeps fp32 shards (the optimizer's master weights) and gathers bf16/fp16 copies
    for the forward and backward (MixedPrecisionPolicy(param_dtype=half, reduce_dtype=fp32): gradients are reduced
    in fp32). Autocast stays on as under DDP, so that the ops autocast keeps in fp32 (losses, softmax) still are.

    "16-mixed" scales the loss with torch's ShardedGradScaler: each rank looks for inf/NaN in its own gradient
    shards only, so the scaler all-reduces what it found, and every rank skips the same steps (a plain GradScaler
    would let one rank step while another skips, and the shards would drift apart)."""

    def mp_policy(self):
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=self.dtype, reduce_dtype=torch.float32)

    def make_scaler(self, **options):
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(self.device_type, **options)

    def unscale(self, optimizer):
        with warnings.catch_warnings():
            # The scaler's found-inf flag is a 1-element tensor that DTensor gradients treat as replicated (it is
            # this rank's own flag until the all-reduce that follows): torch warns about the implicit replication.
            warnings.filterwarnings("ignore", message="Found a non-scalar tensor with numel=1")
            super().unscale(optimizer)


class FSDP(Sharded, ParallelStrategy):
    """Fully sharded data parallel (torch's FSDP2): parameters, gradients and optimizer state split over the ranks.

    Args:
        wrap: which submodules get their own FSDP unit (gathered and freed on their own): None (default) each child
            of the root that holds parameters (a ModuleList/ModuleDict child stands for its elements; a child sharing
            a tied weight with a module outside it stays in the root's unit); a set/list of module classes (every
            instance, e.g. {Block}), or of class names ({"Block"}: how a launch config names them; an empty set: the
            root alone); or a callable `(module) -> bool`. The root is always wrapped last.
        reshard_after_forward: free the gathered parameters after each unit's forward (True, least memory; the
            backward gathers them again) or keep them until the backward (False: one all-gather less per unit).
        cpu_offload: keep the shards (and their gradients and optimizer state) in CPU memory; the optimizer steps on
            the CPU (torch's CPUOffloadPolicy). On a CPU-only machine it changes nothing but is accepted.
        state_dict_type: "sharded" (default): checkpoints are DCP directories written by every rank; "full": one
            ordinary checkpoint file, gathered and written by rank 0.
        activation_checkpointing: which submodules' activations are dropped after their forward and recomputed in
            the backward (less memory, one more forward of them per step): None (default) none; a set/list of
            module classes or class names (every instance, e.g. {Block}); or a callable `(module) -> bool`.
            torch's non-reentrant checkpoint (torch.distributed._composable.checkpoint), applied before
            fully_shard; it wraps nothing, so the module tree and the parameter names do not change.
        mixed_precision: your own torch.distributed.fsdp.MixedPrecisionPolicy (param_dtype, reduce_dtype,
            output_dtype, cast_forward_inputs), used as given for every unit instead of the one the precision
            implies. It must agree with the run's precision: under "32-true" it is what runs (no autocast); under a
            mixed precision its param_dtype must be None, fp32 or that precision's half dtype (autocast and the
            fp16 scaler stay); under a true half precision None or that dtype. Anything else is an error.
        cpu_ram_efficient_loading: every rank starts from rank 0's weights (Accelerate's option of that name): at
            setup the module is sharded and rank 0's whole weights (parameters and buffers) are broadcast into every
            rank's shards, whatever the other ranks' own values were; and a module built under `init_module()`
            (without empty_init) is built in memory on rank 0 only, on the meta device on the others (so one copy
            of the whole model is in CPU memory, not one per rank). Rank 0's module must hold weights (not be on
            the meta device).
        process_group_backend, timeout, start_method: the ProcessWorld's (as DDP's).
    """

    name = "fsdp"
    strategy_name = "fsdp"  # (Lightning's registry name)

    @classmethod
    def get_registered_strategies(cls):
        """The strategy names that build an FSDP (Lightning's FSDPStrategy.get_registered_strategies(): "fsdp",
        "fsdp_cpu_offload"), read from tasktrain's one table of names (tasktrain/names.py)."""
        from tasktrain.names import STRATEGIES

        return [name for name, entry in STRATEGIES.items()
                if (entry.module, entry.cls) == ("tasktrain.strategies.fsdp", "FSDP")]
    _checkpoint_group = None  # the gloo group of async_save's collectives (made at the first background save)

    def __init__(self, accelerator=None, precision=None, wrap=None, reshard_after_forward=True, cpu_offload=False,
                 state_dict_type="sharded", mixed_precision=None, activation_checkpointing=None,
                 cpu_ram_efficient_loading=False, process_group_backend=None, timeout=timedelta(minutes=30), start_method="popen"):
        super().__init__(accelerator=accelerator, precision=precision, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method)
        if state_dict_type not in ("sharded", "full"):
            raise ValueError(f"FSDP state_dict_type={state_dict_type!r}: use 'sharded' (a DCP directory written by "
                             "every rank) or 'full' (one file written by rank 0).")
        if wrap is not None and not callable(wrap) and not _is_class_set(wrap):
            raise TypeError(f"FSDP wrap={wrap!r}: use None (each child with parameters), a set of module classes "
                            "or class names (e.g. {Block} or {'Block'}) or a callable (module) -> bool.")
        if activation_checkpointing is not None and not callable(activation_checkpointing) and \
                not _is_class_set(activation_checkpointing):
            raise TypeError(f"FSDP activation_checkpointing={activation_checkpointing!r}: use None (off), a set of "
                            "module classes (e.g. {Block}) or a callable (module) -> bool.")
        if not isinstance(reshard_after_forward, bool):
            raise TypeError(f"FSDP reshard_after_forward={reshard_after_forward!r}: use True or False.")
        if not isinstance(cpu_ram_efficient_loading, bool):
            raise TypeError(f"FSDP cpu_ram_efficient_loading={cpu_ram_efficient_loading!r}: use True (every rank "
                            "starts from rank 0's weights) or False.")
        self.cpu_ram_efficient_loading = cpu_ram_efficient_loading
        if mixed_precision is not None:
            from torch.distributed.fsdp import MixedPrecisionPolicy

            if not isinstance(mixed_precision, MixedPrecisionPolicy):
                raise TypeError(f"FSDP mixed_precision={mixed_precision!r}: use torch.distributed.fsdp."
                                "MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...), or leave it None (the "
                                "run's precision decides).")
        self.mixed_precision = mixed_precision
        self.activation_checkpointing = activation_checkpointing
        self.checkpointed_names = []  # the submodules the last setup recomputes in backward
        self.wrap = wrap
        self.reshard_after_forward = reshard_after_forward
        self.cpu_offload = bool(cpu_offload)
        if self.cpu_offload:
            self.name = "fsdp_cpu_offload"
        self.state_dict_type = state_dict_type
        self.wrapped_names = []  # what the last setup wrapped (the root is "")
        self._said_wrapped = False
        self._sharded_models = []  # the modules set up since the last teardown, in order
        self._all_optimizers = []  # their optimizers, in order (the Accelerator's save_state order)
        self._owners = {}  # id(optimizer) -> its module
        self._replaced = {}  # id(original parameter) -> (weak reference to it, its sharded parameter)
        self._waiting = []  # optimizers set up before their module (pointed at its shards when it comes)
        self._unreduced = set()  # modules that ran a backward without gradient sync since their last zero_grad

    # -- the run's choices ---------------------------------------------------------------------------------------
    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        super().configure(accelerator, devices, num_nodes, precision)
        if getattr(self._precision_choice, "engine", None) == "FSDP":
            self.precision_plugin = self._precision_choice  # Lightning's FSDPPrecision: its hooks attached
        elif isinstance(self._precision_choice, Precision):
            # A plugin object given to the constructor: FSDP's own of that name instead (a plain GradScaler would
            # let the ranks skip different steps), and a name FSDP cannot run is refused as when given by name.
            wanted = self.build_precision(self.precision.name)
            if type(self.precision) is not type(wanted):
                self.precision = wanted
        if self.mixed_precision is not None:
            _check_policy(self.mixed_precision, self.precision.name)

    def adopt_precision(self, plugin):
        """A precision plugin object (Trainer(plugins=[...])): Lightning's FSDPStrategy takes its FSDPPrecision only
        (its TypeError); FSDP's own plugin of that name runs it."""
        if plugin.engine != "FSDP":
            raise TypeError(f"The FSDP strategy can only work with the `FSDPPrecision` plugin, found {plugin}. "
                            f"Write FSDPPrecision({plugin.name!r}) (tasktrain.plugins), or precision={plugin.name!r}.")
        return plugin.attach_hooks(self.build_precision(plugin.name), self)  # (a subclass's hooks: called here)

    def build_precision(self, name):
        name = normalize_precision(name)
        if name == "32-true":
            return Precision(self.root_device.type)
        if name in ("bf16-mixed", "16-mixed"):
            return FSDPPrecision(name, self.root_device.type)
        if name in ("bf16-true", "16-true"):
            return HalfPrecision(name, self.root_device.type)  # the module is cast before it is sharded
        raise ValueError(f"FSDP runs precision {', '.join(repr(p) for p in _PRECISIONS)}, not {name!r}. Use "
                         "precision='bf16-mixed' for mixed precision (fp32 master shards, bf16 compute).")

    # -- the module ----------------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def module_init_context(self, empty_init=False):
        """empty_init=True: the module is built on the meta device (no memory); setup_module_and_optimizers shards it,
        allocates each rank's shards only, and fills them with each submodule's reset_parameters(). Without
        empty_init the module is built as usual (whole, on the CPU) and sharded at setup; with
        cpu_ram_efficient_loading on rank 0 only (the other ranks build it on the meta device and receive rank 0's
        weights at setup)."""
        rank = self.global_rank if self.env else detect_environment().global_rank  # before setup_environment too
        if not empty_init and not (self.cpu_ram_efficient_loading and rank != 0):
            yield
            return
        with torch.device("meta"):
            yield

    def setup_module_and_optimizers(self, module, optimizers, plan):
        from torch.distributed.fsdp import FSDPModule

        if not plan.calls_steps:
            # prepare(torch.compile(model)): fully_shard must hold the module itself (its units are the module's own
            # children), so the module goes in with its forward compiled in place, with the wrapper's settings.
            module, compiled = unwrap_compiled(module)
            compile_forward_as(module, compiled)
        self.module = module
        self.optimizers = list(optimizers)
        if isinstance(module, FSDPModule):
            if self.optimizers:
                raise ValueError("FSDP: this module is sharded already (set up by an earlier fit or prepare); its "
                                 "optimizers are set up with it, once. Build a new module to train again.")
            self.model = module  # set up by an earlier stage (validate after fit): sharded already
            self._sharded_models.append(module)
            return self.model, self.optimizers
        names = {id(p): name for name, p in module.named_parameters()}
        # Optimizers prepared before their module (the Accelerator's prepare_optimizer, or an earlier prepare call)
        # are pointed at the sharded parameters now too.
        waiting = [o for o in self._waiting if _steps_only_ids(o, names)]
        self._waiting = [o for o in self._waiting if o not in waiting]
        for optimizer in [*self.optimizers, *waiting]:
            _check_optimizer(optimizer, names)
        old = {name: p for name, p in module.named_parameters()}
        on_meta = _on_meta(module)
        from_rank0 = self.cpu_ram_efficient_loading and self._rank0_holds_weights(on_meta)
        if on_meta and not from_rank0:
            _check_resettable(module)
        elif not on_meta:
            module.to(self.root_device)
        # The true half modes: cast before sharding, so the shards (and what the optimizer steps) are half. The
        # Parameter objects stay the same (.to casts in place), so `names` still finds them.
        module = self.precision.convert_module(module)
        # cpu_ram_efficient_loading: rank 0's whole weights, taken before fully_shard replaces them by its shards
        whole = module.state_dict() if from_rank0 and self.is_global_zero else {}
        self._shard(module)
        if from_rank0:
            _load_from_rank0(module, whole, self.root_device, on_meta)
            del whole
        elif on_meta:
            _materialize(module, self.root_device)
        new = dict(module.named_parameters())
        for optimizer in [*self.optimizers, *waiting]:
            _repoint_optimizer(optimizer, names, new)
        # An optimizer built over the original parameters and prepared after the module is repointed then: keep
        # which sharded parameter replaced which (weakly: the original tensors must be free to go).
        for name, p in old.items():
            self._replaced[id(p)] = (weakref.ref(p), new[name])
        if not plan.calls_steps and isinstance(self.precision, MixedPrecision):
            patch_forward(module, self.forward_context)  # the script calls the model's own forward: under autocast
        if plan.calls_steps:
            from torch.distributed.fsdp import register_fsdp_forward_method

            # The loop calls the module's steps, not its forward: the root's gathering and its end-of-backward work
            # must run around them as around a forward.
            for method in _STEP_METHODS:
                if callable(getattr(module, method, None)):
                    register_fsdp_forward_method(module, method)
        self.model = module
        self._sharded_models.append(module)
        for optimizer in [*self.optimizers, *waiting]:
            self._owners[id(optimizer)] = module
            self._all_optimizers.append(optimizer)
        return self.model, self.optimizers

    def _rank0_holds_weights(self, on_meta) -> bool:
        """cpu_ram_efficient_loading: rank 0's module is the source; every rank learns whether it holds weights (a
        collective), so that all refuse together rather than some waiting in the broadcast."""
        holds = self.broadcast(not on_meta if self.is_global_zero else None) if self.world_size > 1 else not on_meta
        if not holds:
            raise ValueError("FSDP(cpu_ram_efficient_loading=True): rank 0's module is on the meta device, so there "
                             "are no weights to start every rank from. Build the model under init_module() without "
                             "empty_init (rank 0 builds it, the others on meta), or load its weights on rank 0 "
                             "before setup; or turn cpu_ram_efficient_loading off to initialise each shard with "
                             "reset_parameters().")
        return True

    def setup_optimizer(self, optimizer):
        """An optimizer prepared on its own (the Accelerator's prepare_optimizer): over the sharded parameters of a
        module set up already, it is that module's; over the original parameters of one, it is pointed at the
        sharded ones; over parameters of no module set up yet, it waits for its module's set-up (and refuses to
        step before it)."""
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for module in self._sharded_models:
            if _steps_only_ids(optimizer, {id(p) for p in module.parameters()}):
                self._owners[id(optimizer)] = module
                self._all_optimizers.append(optimizer)
                return optimizer
        found = [self._replaced.get(id(p)) for p in params]
        sharded = {id(p): r[1] for p, r in zip(params, found) if r is not None and r[0]() is p}
        new_ids = {id(p) for p in sharded.values()}
        module = next((m for m in self._sharded_models if new_ids <= {id(p) for p in m.parameters()}), None)
        if params and len(sharded) == len({id(p) for p in params}) and module is not None:
            if any(len(state) for state in optimizer.state.values()):
                raise ValueError(f"FSDP: {type(optimizer).__name__} has stepped already (it holds state for the "
                                 "unsharded parameters). Prepare it before its first step.")
            for group in optimizer.param_groups:
                group["params"] = [sharded[id(p)] for p in group["params"]]
            optimizer.state.clear()
            self._owners[id(optimizer)] = module
            self._all_optimizers.append(optimizer)
            return optimizer
        self._waiting.append(optimizer)  # its module may come in a later prepare; stepping before is refused
        return optimizer

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        if self._waiting and optimizer in self._waiting:
            raise ValueError(f"FSDP: {type(optimizer).__name__} steps parameters of no prepared model (its model was "
                             "never prepared, or it mixes the parameters of several). Prepare its model too, "
                             "with one optimizer per model: accelerator.prepare(model, optimizer).")
        return super().optimizer_step(optimizer, closure, model, **kwargs)

    def _shard(self, module):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mesh = init_device_mesh(self.root_device.type, (self.world_size,))
        if self.mixed_precision is not None:
            mp = self.mixed_precision  # the user's own, checked against the precision by configure
        else:
            mp = self.precision.mp_policy() if isinstance(self.precision, FSDPPrecision) else MixedPrecisionPolicy()
        offload = CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda") if self.cpu_offload else OffloadPolicy()
        options = dict(mesh=mesh, mp_policy=mp, offload_policy=offload)
        targets = self._wrap_targets(module)
        root_name = type(module).__name__  # before fully_shard renames the class (FSDP<name>)
        self.checkpointed_names = self._select(module, self.activation_checkpointing, "activation_checkpointing")
        if self.checkpointed_names:
            from torch.distributed._composable import checkpoint

            # Before fully_shard, as torch's FSDP2 tests and torchtitan do: the unit's gathering then runs again
            # around the recomputed forward. Non-reentrant (the composable one is), so no input needs grad.
            for name in self.checkpointed_names:
                checkpoint(module.get_submodule(name))
        # Innermost first: a unit's parameters are those not already in a unit below it.
        for name in reversed(targets):
            fully_shard(module.get_submodule(name), reshard_after_forward=self.reshard_after_forward, **options)
        # The root's parameters are needed again at once by the backward: keeping them saves one all-gather.
        fully_shard(module, reshard_after_forward=False, **options)
        self.wrapped_names = [*targets, ""]
        if self.is_global_zero and not self._said_wrapped:
            shown = ", ".join(targets[:8]) + (f", ... ({len(targets)} in all)" if len(targets) > 8 else "")
            print(f"[tasktrain] FSDP wrapped {len(targets)} module(s) [{shown}] and the root "
                  f"{root_name}", flush=True)
            if self.checkpointed_names:
                names = self.checkpointed_names
                shown = ", ".join(names[:8]) + (f", ... ({len(names)} in all)" if len(names) > 8 else "")
                print(f"[tasktrain] FSDP activation checkpointing: {len(names)} module(s) [{shown}] recompute their "
                      "forward in the backward", flush=True)
            if self.mixed_precision is not None:
                print(f"[tasktrain] FSDP uses your {_describe_policy(self.mixed_precision)} for every unit (the run's "
                      f"precision is {self.precision.name})", flush=True)
            self._said_wrapped = True

    def _wrap_targets(self, module):
        """Qualified names of the submodules that get their own unit, in module order."""
        if self.wrap is None:
            # Each child with parameters; a container without a forward of its own (ModuleList/ModuleDict, which
            # fully_shard cannot wrap) stands for its elements (a GPT's list of blocks: one unit per block). A child
            # that shares a parameter with a module outside it (tied embeddings) leaves it to the root's unit.
            candidates = _children_with_parameters(module)
            shared = _shared_between(module, candidates)
            return [name for name in candidates if name not in shared]
        targets = self._select(module, self.wrap, "wrap")
        shared = _shared_between(module, targets)
        if shared:
            raise ValueError(f"FSDP wrap={self.wrap!r}: {sorted(shared)} share parameters (tied weights) with a "
                             "module outside them, and a shared parameter must stay in the unit around both users. "
                             "Leave them out of `wrap` (their parameters then go to the root's unit), or leave "
                             "wrap=None (which does so).")
        return targets

    @staticmethod
    def _select(module, choice, argument):
        """Qualified names of the submodules (not the root) that `choice` picks: None or an empty set none, a set of
        classes every instance (one that matches nothing is an error: a misspelt choice must not pass silently), a
        callable those it returns True for."""
        if choice is None:
            return []
        if _is_class_set(choice):
            if not choice:
                return []  # wrap=[]: the root alone (Accelerate's NO_WRAP)
            classes = tuple(c for c in choice if not isinstance(c, str))
            by_name = {c for c in choice if isinstance(c, str)}
            chosen = [name for name, m in module.named_modules()
                      if name and (isinstance(m, classes) or type(m).__name__ in by_name)]
            if not chosen:
                fix = ("leave wrap=None (each child with parameters)" if argument == "wrap" else
                       "leave activation_checkpointing=None")
                shown = sorted(c if isinstance(c, str) else c.__name__ for c in choice)
                raise ValueError(f"FSDP {argument}={shown}: {type(module).__name__} has no submodule of these "
                                 f"classes. Name the classes of its repeated blocks, or {fix}.")
            return chosen
        return [name for name, m in module.named_modules() if name and choice(m)]

    def configure_processes(self, process_group_backend=None, timeout=None, ddp_kwargs=None):
        if ddp_kwargs:
            # No DDP wrapper is built under FSDP: said aloud rather than dropped (as under DeepSpeed).
            warnings.warn(f"DistributedDataParallelKwargs {sorted(ddp_kwargs)} are not used under FSDP: it builds no "
                          "DistributedDataParallel wrapper.")
        super().configure_processes(process_group_backend, timeout)

    def trainable_parameters_changed(self, who: str):
        """FSDP fixes at its first forward which parameters of each unit get gradients reduced; a change during
        training is not supported (not tested), so it is refused before it can train apart."""
        raise ValueError(f"{who} changed which parameters require gradients during training, and FSDP set up its "
                         "units' gradient reduction from those that required them at its first step. Set "
                         "requires_grad before training, or use strategy='ddp'.")

    def unwrap_model(self, model):
        return super().unwrap_model(model)  # fully_shard keeps the module object: nothing wraps it

    def teardown(self):
        self._sharded_models, self._all_optimizers, self._owners = [], [], {}
        self._replaced, self._waiting, self._unreduced = {}, [], set()
        super().teardown()

    # -- the step ------------------------------------------------------------------------------------------------
    def training_step(self, *args, **kwargs):
        with self.forward_context("training_step"):
            return self.module.training_step(*args, **kwargs)  # (an FSDP forward method, registered above)

    def eval_step(self, step_fn, *args, **kwargs):
        # FSDP's gathered parameters must keep their version counter, which tensors made under inference_mode lack
        # (a world of one fails at the first all-gather): evaluation steps run under no_grad instead.
        with torch.inference_mode(False), torch.no_grad(), self.forward_context(step_name(step_fn)):
            return step_fn(*args, **kwargs)

    @contextlib.contextmanager
    def no_backward_sync(self, enabled: bool, model=None):
        """Inside an accumulation window the gradients stay whole and local (no reduce-scatter); the window's
        last micro-batch reduces their sum."""
        from torch.distributed.fsdp import FSDPModule

        model = self.model if model is None else model
        if not enabled or not isinstance(model, FSDPModule):
            yield
            return
        model.set_requires_gradient_sync(False)
        self._unreduced.add(model)  # FSDP keeps these gradients in its own buffers, outside param.grad
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def zero_grad(self, optimizer):
        """Also drops the gradients a no_sync backward left in FSDP's own unsharded buffers (param.grad does not
        hold them until a synced backward adds them in): under DDP zero_grad drops such local gradients, and a
        later synced backward must not reduce them here either."""
        super().zero_grad(optimizer)
        module = self._owners.get(id(optimizer), self.module)
        if module in self._unreduced:
            self._unreduced.discard(module)
            _drop_unreduced_gradients(module)

    def clip_gradients(self, optimizer, max_norm=None, max_value=None, norm_type=2.0, unscale=True):
        """The norm over all shards: the gradients are DTensors, whose norm torch reduces over the ranks. Summed in the
        module's parameter order, as the base contract does (the optimizer was repointed at the sharded parameters,
        which are the module's own)."""
        if unscale:  # (False: as they are, the base contract's)
            self.unscale_gradients(optimizer)
        params = [p for p in self._in_module_order(optimizer) if p.grad is not None]
        if not params:
            return torch.tensor(0.0)
        norm = torch.nn.utils.get_total_norm([p.grad for p in params], norm_type)
        norm = _full(norm)
        if max_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
        if max_value is not None:
            torch.nn.utils.clip_grad_value_(params, max_value)  # elementwise: each shard on its own is exact
        return norm

    # -- state ---------------------------------------------------------------------------------------------------
    def _options(self, full):
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=full, cpu_offload=full)

    def module_state_dict(self, model=None):
        """The module's shards (DTensors) for a sharded checkpoint; the whole weights on rank 0 (gathered; other ranks
        get an empty dict) under state_dict_type="full"."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        target = self.module if model is None else self.unwrap_model(model)
        if not _is_sharded(target):
            return plain_state_dict(target.state_dict())
        return plain_state_dict(get_model_state_dict(target, options=self._options(self.state_dict_type == "full")))

    def optimizer_state(self, optimizer):
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        module = self._owners.get(id(optimizer), self.module)
        if not _is_sharded(module):
            return optimizer.state_dict()
        return get_optimizer_state_dict(module, optimizer, options=self._options(self.state_dict_type == "full"))

    def load_module_state_dict(self, state_dict, model=None, strict=True):
        """A sharded state dict (loaded from a DCP directory) goes in shard by shard; a whole one (a plain file) is
        read by rank 0 and streamed to the others, each keeping its shard."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        target = self.module if model is None else self.unwrap_model(model)
        if not _is_sharded(target):
            load_plain_state_dict(target, state_dict, strict=strict)
            return
        state_dict = compiled_state_dict(target, state_dict)  # the plain names, as the module's own (compiled) ones
        if _holds_dtensors(state_dict):
            set_model_state_dict(target, state_dict, options=StateDictOptions(strict=strict))
            return
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=strict)
        set_model_state_dict(target, state_dict if self.is_global_zero else {}, options=options)

    def load_optimizer_state(self, optimizer, state):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        module = self._owners.get(id(optimizer), self.module)
        if not _is_sharded(module):
            optimizer.load_state_dict(state)
            return
        if _holds_dtensors(state) or (_keyed_by_name(state) and not state.get("state")):
            # Shards, or an optimizer without per-parameter state (SGD without momentum): its hyper-parameters
            # only, which every rank holds whole (the broadcast below needs a tensor to find the device by)
            set_optimizer_state_dict(module, optimizer, state)
            return
        if not _keyed_by_name(state):
            raise CheckpointError(
                "This checkpoint holds a plain optimizer state (keyed by parameter number), not one written under "
                "FSDP: an FSDP fit resumes from a checkpoint written under FSDP (a directory, or a "
                "state_dict_type='full' file). Convert a plain checkpoint first, optimizer state included: "
                "tasktrain convert FILE DIR --to fsdp, then fit(ckpt_path=DIR). To start from its weights alone, "
                "load them into the module before fit: module.load_state_dict(torch.load(path, "
                "weights_only=True)['state_dict']).")
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(module, optimizer, state if self.is_global_zero else {}, options=options)

    @checked_collective("full_state_dict")  # a rank that alone waits here (a rank-0-only call) is named
    def full_state_dict(self, model=None):
        """The whole weights on every rank (every rank calls it: the shards are gathered)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        target = self.module if model is None else self.unwrap_model(model)
        if not _is_sharded(target):
            return plain_state_dict(target.state_dict())
        state = get_model_state_dict(target, options=StateDictOptions(full_state_dict=True))
        return plain_state_dict({k: _full(v).detach().cpu().clone() for k, v in state.items()})

    def check_full_state_dict(self, obj, where):
        if _holds_dtensors(obj):
            raise ValueError(f"{where} holds FSDP shards (DTensors), not whole tensors: gather them first with "
                             "strategy.full_state_dict() (the Accelerator's get_state_dict) on every rank.")

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict, filepath, storage_options=None):
        """state_dict_type="sharded": a directory at `path` (DCP shards of the module and the optimizers, written by
        every rank, plus our state file), written as `path`.tmp and renamed into place. "full": one file by rank 0.
        (Lightning's signature; storage_options goes to the CheckpointIO of a full checkpoint, and is refused for
        a sharded one, which torch.distributed.checkpoint writes.)"""
        path = os.path.abspath(os.fspath(filepath))
        if self.state_dict_type == "full" or not _holds_dtensors(checkpoint.get("state_dict")):
            return super().save_checkpoint(checkpoint, path, storage_options)
        if storage_options is not None:
            raise TypeError("FSDPStrategy.save_checkpoint(storage_options=...): a sharded checkpoint is written by "
                            "torch.distributed.checkpoint, which takes no storage options. Leave storage_options "
                            "out, or use state_dict_type='full'.")
        tmp = f"{path}.tmp"
        self._write_directory(tmp, checkpoint, STATE_FILE)
        if self.is_global_zero:
            replace_dir(tmp, path)
        self.barrier("save_checkpoint")

    def save_checkpoint_into(self, directory, checkpoint, filename):
        if self.state_dict_type == "full" or not _holds_dtensors(checkpoint.get("models", checkpoint.get("state_dict"))):
            return super().save_checkpoint_into(directory, checkpoint, filename)
        self._write_directory(os.path.abspath(os.fspath(directory)), checkpoint, filename)
        self.barrier("save_state")

    def _write_directory(self, directory, checkpoint, state_file):
        import shutil

        import torch.distributed.checkpoint as dcp

        if self.is_global_zero and directory.endswith(".tmp") and os.path.isdir(directory):
            shutil.rmtree(directory)  # the leftover of an interrupted save
        self.barrier("fsdp_save_begin")
        shards, state = _split(checkpoint)
        dcp.save(shards, checkpoint_id=directory)
        if self.is_global_zero:
            state = with_own(state, fsdp={"world_size": self.world_size, "layout": "dcp"})
            atomic_save(state, os.path.join(directory, state_file))

    def save_checkpoint_async(self, checkpoint: dict, path: str, on_complete=None, filename=None):
        """Sharded: torch.distributed.checkpoint.async_save stages every rank's shards into CPU memory and writes them
        in a thread (its collectives on a gloo group of their own, so they never meet training's); rank 0 stages our
        state file. Once DCP's save is done on rank 0 every rank's shards are written and fsynced (DCP's last step
        gathers all ranks' results before rank 0 writes .metadata): rank 0 then writes the state file and renames
        `path`.tmp to `path`. "full" (or unsharded): one file by rank 0, as the default."""
        shards_of = checkpoint.get("models", checkpoint.get("state_dict"))
        if self.state_dict_type == "full" or not _holds_dtensors(shards_of):
            return super().save_checkpoint_async(checkpoint, path, on_complete, filename)
        import shutil

        import torch.distributed.checkpoint as dcp

        writer = self.checkpoint_writer
        writer.wait()
        path = os.path.abspath(os.fspath(path))
        tmp = f"{path}.tmp"
        if self.is_global_zero and os.path.isdir(tmp):
            shutil.rmtree(tmp)  # the leftover of an interrupted save
        if self._checkpoint_group is None:
            self._checkpoint_group = dist.new_group(backend="gloo")  # every rank is here: a collective call is fine
        self.barrier("fsdp_async_save_begin")
        shards, state = _split(checkpoint)
        future = dcp.async_save(shards, checkpoint_id=tmp, process_group=self._checkpoint_group)
        staged = None
        if self.is_global_zero:
            staged = writer.staged["state"] = stage_to_cpu(state, writer.staged.get("state"))
            staged = with_own(staged, fsdp={"world_size": self.world_size, "layout": "dcp"})

        def write():
            future.result()
            if self.is_global_zero:
                fsync_save(staged, os.path.join(tmp, filename or STATE_FILE))
                replace_dir(tmp, path)
                if on_complete is not None:
                    on_complete()

        writer.start(write, path)
        return writer

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        """(Lightning's signature; files are read with weights_only=True whatever weights_only says.)"""
        path = os.fspath(checkpoint_path)
        if not os.path.isdir(path):
            # A full checkpoint (state_dict_type="full" or any plain one): rank 0's copy of the weights and the
            # optimizer state is broadcast to the others, each keeping its shard. Mapped, not read: the other ranks
            # never touch those tensors, so they never hold the whole model (hooks that look at them still can).
            return load_checkpoint_file(path, mmap=True)
        return self._read_directory(path, STATE_FILE)

    def load_checkpoint_from(self, directory, filename):
        directory = os.fspath(directory)
        if os.path.isfile(os.path.join(directory, ".metadata")):
            return self._read_directory(directory, filename)
        return super().load_checkpoint_from(directory, filename)

    def _read_directory(self, path, state_name):
        """Our state file, with the module's and the optimizers' shards read into what this run holds now: DCP
        reshards them to this world size."""
        state_file = os.path.join(path, state_name)
        if not os.path.isfile(state_file) or not os.path.isfile(os.path.join(path, ".metadata")):
            raise CheckpointError(f"{path!r} is not a checkpoint directory written by the tasktrain FSDP strategy "
                                  f"(it needs {state_name} and DCP's .metadata): an interrupted save, or another "
                                  "strategy's checkpoint.")
        ckpt = load_checkpoint_file(state_file)
        template = {}
        for key in _SHARD_KEYS:
            if ckpt.get(key) == _SHARDED_MARK:
                template[key] = self._current(key)
                ckpt[key] = template[key]
                if not template[key]:
                    del template[key]  # nothing of it to load here (no optimizer in validate/test/predict)
        load_dcp(template, path)  # issue 38: .metadata and non-tensor items read the safe way
        return ckpt

    def _current(self, key):
        """What this run holds under `key`, for DCP to load the saved shards into, in place."""
        if key == "state_dict":
            return self.module_state_dict()
        if key == "models":
            return [self.module_state_dict(m) for m in self._sharded_models]
        if not self._all_optimizers:
            return []  # validate/test/predict: no optimizer to load into
        return [self.optimizer_state(o) for o in self._all_optimizers]

    def check_full_parameters(self, who: str):
        raise ValueError(f"{who} needs the whole parameters on every rank, and FSDP shards them (each rank holds a "
                         "slice of each parameter). Use strategy='ddp' or DeepSpeed stage 1 or 2, or remove it.")

    def link_checkpoint(self, src, dst):
        """ModelCheckpoint's last.ckpt: a directory of hard links to `src`'s files (a copy where links fail)."""
        from tasktrain.checkpoint_io import atomic_link

        if self.is_global_zero:
            link_tree(src, dst) if os.path.isdir(src) else atomic_link(src, dst)
        self.barrier("link_checkpoint")

    def describe(self):
        backend = dist.get_backend() if dist.is_initialized() else "?"
        extras = [f"reshard_after_forward={self.reshard_after_forward}", f"state_dict_type={self.state_dict_type}"]
        if self.cpu_offload:
            extras.append("cpu_offload")
        if self.cpu_ram_efficient_loading:
            extras.append("cpu_ram_efficient_loading (every rank starts from rank 0's weights)")
        if self.mixed_precision is not None:
            extras.append(_describe_policy(self.mixed_precision))
        if self.checkpointed_names:
            extras.append(f"activation_checkpointing={len(self.checkpointed_names)} module(s)")
        return (f"strategy={self.name} ({', '.join(extras)}), world_size={self.world_size}, backend={backend}, "
                f"device={self.root_device}")

