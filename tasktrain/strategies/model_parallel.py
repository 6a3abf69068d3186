"""ModelParallelStrategy: tensor parallel and data parallel on one named DeviceMesh (Lightning's strategy of that name).

The world is laid out as a 2-D mesh `("data_parallel", "tensor_parallel")`: each row of `tensor_parallel_size`
processes holds one copy of the model split by tensor parallelism, and the rows are FSDP2 shards of each other
(data parallel). The user parallelizes the module in `configure_model()`, where `self.device_mesh` is the mesh
(torch's `parallelize_module` on `device_mesh["tensor_parallel"]`, `fully_shard` on `device_mesh["data_parallel"]`);
what the user left out of `fully_shard`, the strategy shards on the data-parallel mesh at set-up (each child that
holds parameters, then the root), so that the data-parallel rows always reduce their gradients.

Everything else is the FSDP strategy's (this class extends it): the processes and their process group, the step,
DTensor gradient clipping (the norm is reduced over the whole mesh), and checkpoints: a DCP directory written by
every rank (`save_distributed_checkpoint=True`), which DCP reshards on load onto any other mesh (data parallel only,
tensor parallel only, another shape, one process), or one file gathered on rank 0. What differs:

- data: the Trainer shards its loaders by the data-parallel rank only (`data_parallel_size`/`data_parallel_rank`):
  the processes of one tensor-parallel group see the same batch;
- backward runs under torch's `loss_parallel()` when tensor_parallel_size > 1, so a loss computed from logits
  sharded over the class dimension (`ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)` and
  `cross_entropy` under `loss_parallel()` in the step) differentiates without an override of the module's backward;
- refusals before training: a mesh that does not tile the world, a module without configure_model, meta-device
  initialisation on a CPU mesh (measured: random initialisation of sharded DTensors on a CPU mesh gives every rank
  the same values), and torch.compile of single tensor-parallel blocks (measured on torch 2.13: the backward of
  tensor-parallel-only blocks fails with "'Tensor' object has no attribute '_local_tensor'"; with fully_shard as
  well it ran in a one-step check outside the strategy, untested through it);
- reductions: mean, max and min over the world (the processes of a tensor-parallel group hold the same logged
  values, so this is the data-parallel result, and every rank gets the same number); "sum" is divided by
  tensor_parallel_size, the sum over data parallel for values that tensor parallelism replicates;
- checkpoints record the mesh (`device_mesh` in the checkpoint), and a resume onto another mesh says what it
  resharded;
- HSDP (data_parallel_replicate_size > 1): a third dimension, replicas of FSDP shards (Accelerate's dp_replicate).
"""
import contextlib
import weakref
from datetime import timedelta
from typing import Literal, Optional, Union

import torch

from tasktrain.checkpoint_io import own_state, with_own
from tasktrain.names import normalize_precision
from tasktrain.strategies.fsdp import FSDP

MESH_NAMES = ("data_parallel", "tensor_parallel")
HSDP_NAMES = ("data_parallel_replicate", "data_parallel_shard", "tensor_parallel")  # data_parallel_replicate_size > 1
_STEPS_REGISTERED = weakref.WeakSet()  # modules whose steps run as FSDP forward methods already


_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-true")  # what Lightning's ModelParallelStrategy runs


class ModelParallelStrategy(FSDP):
    """Tensor parallelism and FSDP2 data parallelism on one 2-D DeviceMesh.

    Args:
        data_parallel_size: processes per tensor-parallel position that hold FSDP shards of each other; "auto"
            (default): world size // tensor_parallel_size.
        tensor_parallel_size: processes that split each layer between them; "auto" (default, Lightning's): every
            process of a node, the nodes then data-parallel; 1: data parallel only.
            data_parallel_size * tensor_parallel_size must be the world size.
        save_distributed_checkpoint: True (default): checkpoints are DCP directories written by every rank, which
            load onto any mesh; False: one file with the whole weights and optimizer state, written by rank 0.
        process_group_backend, timeout: as DDP's.
        data_parallel_replicate_size: HSDP (not in Lightning): the data-parallel processes as this many replicas of
            data_parallel_size // data_parallel_replicate_size FSDP shards each. The mesh is then
            ("data_parallel_replicate", "data_parallel_shard", "tensor_parallel"), with "data_parallel" the first two
            flattened (the data is cut by it), and the strategy's fully_shard runs over the first two (gradients
            reduce-scattered within a replica, all-reduced across replicas). Default 1: FSDP over all of data
            parallel.
        wrap, reshard_after_forward, cpu_offload, mixed_precision, activation_checkpointing: as FSDP's, for the
            units the strategy shards (what configure_model did not fully_shard itself); not in Lightning's.
    """

    name = "model_parallel"
    applies_layer_sync = False  # (Lightning's ModelParallelStrategy never calls its LayerSync)

    def __init__(
        self,
        data_parallel_size: Union[Literal["auto"], int] = "auto",
        tensor_parallel_size: Union[Literal["auto"], int] = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: Optional[str] = None,
        timeout: Optional[timedelta] = timedelta(minutes=30),
        accelerator=None,
        precision=None,
        data_parallel_replicate_size=1,
        wrap=None,
        reshard_after_forward=None,
        cpu_offload=False,
        mixed_precision=None,
        activation_checkpointing=None,
    ):
        if data_parallel_size != "auto" and (not isinstance(data_parallel_size, int) or data_parallel_size < 1):
            raise ValueError(f"ModelParallelStrategy(data_parallel_size={data_parallel_size!r}): use 'auto' (world "
                             "size // tensor_parallel_size) or a positive number of processes.")
        if tensor_parallel_size != "auto" and (not isinstance(tensor_parallel_size, int) or
                                               isinstance(tensor_parallel_size, bool) or tensor_parallel_size < 1):
            raise ValueError(f"ModelParallelStrategy(tensor_parallel_size={tensor_parallel_size!r}): use a positive "
                             "number of processes (1: data parallel only), or 'auto' (Lightning's: every process "
                             "of a node, devices).")
        if not isinstance(data_parallel_replicate_size, int) or isinstance(data_parallel_replicate_size, bool) or \
                data_parallel_replicate_size < 1:
            raise ValueError(f"ModelParallelStrategy(data_parallel_replicate_size={data_parallel_replicate_size!r}): "
                             "use a positive number of replicas (1: no replication, FSDP over all of data "
                             "parallel).")
        if not isinstance(save_distributed_checkpoint, bool):
            raise TypeError(f"ModelParallelStrategy(save_distributed_checkpoint={save_distributed_checkpoint!r}): "
                            "use True (a DCP directory) or False (one file).")
        super().__init__(accelerator=accelerator, precision=precision,
                         state_dict_type="sharded" if save_distributed_checkpoint else "full",
                         process_group_backend=process_group_backend, timeout=timeout, wrap=wrap,
                         reshard_after_forward=True if reshard_after_forward is None else reshard_after_forward,
                         cpu_offload=cpu_offload,
                         mixed_precision=mixed_precision, activation_checkpointing=activation_checkpointing)
        self.name = "model_parallel"
        self.save_distributed_checkpoint = save_distributed_checkpoint
        self._requested_sizes = (data_parallel_size, tensor_parallel_size)
        self.data_parallel_replicate_size = data_parallel_replicate_size
        self._reshard_given = reshard_after_forward is not None  # (default True: the strategy's units are freed)
        self._device_mesh = None
        self._mesh_group = None  # the process group the mesh was made in
        self._layout_now = None  # (data_parallel_size, data_parallel_rank, tensor_parallel_size) of the mesh
        self._fsdp_mesh = None  # the data-parallel part of the mesh, which fully_shard shards over

    # -- the mesh ------------------------------------------------------------------------------------------------
    def mesh_shape(self, world_size):
        """(data_parallel_size, tensor_parallel_size) for a world of `world_size` processes, or a ValueError."""
        dp, tp = self._requested_sizes
        if tp == "auto":  # Lightning's: the processes of one node tensor-parallel, the nodes data-parallel
            tp = max(1, world_size // max(1, self.num_nodes))
        if dp == "auto":
            if world_size % tp:
                raise ValueError(f"ModelParallelStrategy(tensor_parallel_size={tp}) does not divide the world of "
                                 f"{world_size} processes. Use a tensor_parallel_size that divides it, or start a "
                                 "multiple of it (devices x num_nodes).")
            dp = world_size // tp
        if dp * tp != world_size:
            raise ValueError(f"ModelParallelStrategy: data_parallel_size={dp} x tensor_parallel_size={tp} = {dp * tp}, "
                             f"but the world has {world_size} processes. Make the product the world size (devices x "
                             "num_nodes), or leave data_parallel_size='auto'.")
        replicas = self.data_parallel_replicate_size
        if dp % replicas:
            raise ValueError(f"ModelParallelStrategy(data_parallel_replicate_size={replicas}) does not divide "
                             f"data_parallel_size={dp}: the data-parallel processes are replicas x shards. Use a "
                             "replicate size that divides it.")
        return dp, tp

    def configure(self, accelerator=None, devices=1, num_nodes=1, precision=None):
        # Lightning's Trainer refuses these precisions for its ModelParallelStrategy (its accelerator connector, before
        # anything runs): 16-mixed's GradScaler, 64-true, ... are not among them. Its type and words, then ours.
        name = self.requested_precision or normalize_precision(precision)  # (None: the default, 32-true)
        if name not in _PRECISIONS:
            raise ValueError(f"The `ModelParallelStrategy` does not support `Fabric(..., precision={name!r})`. Choose a "
                             f"different precision among: {', '.join(_PRECISIONS)}. (Lightning refuses it, and so does "
                             "tasktrain, before any process starts; FSDP(...) runs it.)")
        super().configure(accelerator, devices, num_nodes, precision)
        self.mesh_shape(devices * num_nodes)  # before any process starts: every rank would fail alike

    @property
    def device_mesh(self):
        """The ("data_parallel", "tensor_parallel") DeviceMesh, once setup_environment made it."""
        if self._device_mesh is None:
            raise RuntimeError("ModelParallelStrategy.device_mesh is made when the processes start (at the start of "
                               "fit/validate/test/predict): read it in configure_model() or later.")
        return self._device_mesh

    @property
    def data_parallel_size(self):
        return self._layout_now[0] if self._layout_now else self.world_size

    @property
    def data_parallel_rank(self):
        return self._layout_now[1] if self._layout_now else self.global_rank

    @property
    def tensor_parallel_size(self):
        if self._layout_now:
            return self._layout_now[2]
        tp = self._requested_sizes[1]
        return self.devices if tp == "auto" else tp  # "auto": every process of a node (Lightning's)

    def setup_environment(self):
        import torch.distributed as dist

        super().setup_environment()
        # One mesh per process group: a world of one destroys its group at the end of a stage and makes a new one
        if self._device_mesh is None or self._mesh_group is not dist.group.WORLD:
            self._device_mesh, self._fsdp_mesh, self._layout_now = self._make_mesh()
            self._mesh_group = dist.group.WORLD

    def _make_mesh(self):
        """(the mesh, the mesh fully_shard shards over, (data_parallel_size, data_parallel_rank,
        tensor_parallel_size)): read once, as the sizes outlive the process group (a world of one destroys it)."""
        from torch.distributed.device_mesh import init_device_mesh

        dp, tp = self.mesh_shape(self.world_size)
        replicas = self.data_parallel_replicate_size
        if replicas == 1:
            mesh = init_device_mesh(self.root_device.type, (dp, tp), mesh_dim_names=MESH_NAMES)
            return mesh, mesh["data_parallel"], (dp, mesh["data_parallel"].get_local_rank(), tp)
        # HSDP: replicas of FSDP shards. "data_parallel" (both, flattened) stays the dimension the data is cut by
        mesh = init_device_mesh(self.root_device.type, (replicas, dp // replicas, tp), mesh_dim_names=HSDP_NAMES)
        fsdp_mesh = mesh[HSDP_NAMES[:2]]
        flat = fsdp_mesh._flatten("data_parallel")
        return mesh, fsdp_mesh, (dp, flat.get_local_rank(), tp)

    def module_init_context(self, empty_init=False):
        if empty_init and self.root_device.type == "cpu":
            raise ValueError(_META_ON_CPU)
        return super().module_init_context(empty_init)

    # -- the module ----------------------------------------------------------------------------------------------
    def setup_module_and_optimizers(self, module, optimizers, plan):
        from torch.distributed.fsdp import FSDPModule

        if plan.calls_steps and not _defines_configure_model(module):
            raise TypeError(f"ModelParallelStrategy: {type(module).__name__} does not override configure_model(). "
                            "Under this strategy the module is parallelized there: apply parallelize_module on "
                            "self.device_mesh['tensor_parallel'] (and fully_shard on self.device_mesh"
                            "['data_parallel'], or leave that to the strategy).")
        if self.root_device.type == "cpu" and any(t.is_meta for t in [*module.parameters(), *module.buffers()]):
            raise ValueError(_META_ON_CPU)
        _refuse_block_compile(module)
        if isinstance(module, FSDPModule):
            return self._adopt_sharded(module, optimizers, plan)
        out = super().setup_module_and_optimizers(module, optimizers, plan)
        if plan.calls_steps:
            _STEPS_REGISTERED.add(module)  # FSDP registered its steps (a second registration would wrap them twice)
        return out

    def _adopt_sharded(self, module, optimizers, plan):
        """The user's configure_model ended with fully_shard(model): the optimizers were built over its sharded
        parameters already, so nothing is repointed."""
        from torch.distributed.fsdp import register_fsdp_forward_method

        if any(m is module for m in self._sharded_models):
            return super().setup_module_and_optimizers(module, optimizers, plan)  # an earlier stage's: as FSDP
        self._refuse_unit_options()
        self.module = module
        self.optimizers = list(optimizers)
        own = {id(p) for p in module.parameters()}
        for optimizer in self.optimizers:
            if not all(id(p) in own for group in optimizer.param_groups for p in group["params"]):
                raise ValueError(f"ModelParallelStrategy: {type(optimizer).__name__} steps parameters that are not "
                                 "the module's after configure_model: build the optimizer in configure_optimizers "
                                 "(it runs after configure_model) from self.parameters().")
        if plan.calls_steps and module not in _STEPS_REGISTERED:  # once per module: fit, then validate, ...
            for method in ("training_step", "validation_step", "test_step", "predict_step"):
                if callable(getattr(module, method, None)):
                    register_fsdp_forward_method(module, method)
            _STEPS_REGISTERED.add(module)
        self.model = module
        self._sharded_models.append(module)
        for optimizer in self.optimizers:
            self._owners[id(optimizer)] = module
            self._all_optimizers.append(optimizer)
        return self.model, self.optimizers

    def _shard(self, module):
        """fully_shard on the data-parallel mesh: each child holding parameters that the user did not shard (none
        when the user sharded some: their choice of units stands), then the root."""
        from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        from tasktrain.strategies.fsdp import FSDPPrecision

        mesh = self._fsdp_mesh
        if self.mixed_precision is not None:
            mp = self.mixed_precision  # the user's own (FSDP's configure checked it against the precision)
        else:
            mp = self.precision.mp_policy() if isinstance(self.precision, FSDPPrecision) else MixedPrecisionPolicy()
        offload = CPUOffloadPolicy(pin_memory=self.root_device.type == "cuda") if self.cpu_offload else OffloadPolicy()
        user_sharded = any(isinstance(m, FSDPModule) for m in module.modules())
        if user_sharded:
            self._refuse_unit_options()
        targets = [] if user_sharded else self._wrap_targets(module)
        if not user_sharded:
            self.checkpointed_names = self._select(module, self.activation_checkpointing, "activation_checkpointing")
            if self.checkpointed_names:
                from torch.distributed._composable import checkpoint

                for name in self.checkpointed_names:  # before fully_shard, as FSDP's _shard
                    checkpoint(module.get_submodule(name))
        for name in reversed(targets):
            fully_shard(module.get_submodule(name), mesh=mesh, mp_policy=mp, offload_policy=offload,
                        reshard_after_forward=self.reshard_after_forward)
        fully_shard(module, mesh=mesh, mp_policy=mp, offload_policy=offload, reshard_after_forward=False)
        self.wrapped_names = [*targets, ""]
        if self.is_global_zero and not self._said_wrapped:
            how = "your fully_shard units and" if user_sharded else f"{len(targets)} module(s) and"
            print(f"[tasktrain] {type(self).__name__} sharded {how} the root over the data-parallel mesh "
                  f"{tuple(mesh.shape)}", flush=True)
            self._said_wrapped = True

    def _refuse_unit_options(self):
        """wrap=, activation_checkpointing= and reshard_after_forward= act on the strategy's units: with the user's
        own fully_shard units they would do nothing, which must not pass silently."""
        given = [name for name in ("wrap", "activation_checkpointing") if getattr(self, name) is not None]
        given += ["reshard_after_forward"] if self._reshard_given else []
        if given:
            raise ValueError(f"{type(self).__name__}: configure_model applied fully_shard itself, so the strategy "
                             f"adds only the root and {' and '.join(given)} would do nothing. Drop "
                             f"{' and '.join(given)}, or leave fully_shard to the strategy.")

    # -- the step ------------------------------------------------------------------------------------------------
    def backward(self, closure_loss, optimizer, *args, **kwargs):
        if self.tensor_parallel_size > 1:
            with _loss_parallel():
                return super().backward(closure_loss, optimizer, *args, **kwargs)
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    def reduce(self, tensor, group=None, reduce_op="mean", *, op=None):
        from torch.distributed.tensor import DTensor

        from tasktrain.strategies.base import lightning_reduce_op

        op = lightning_reduce_op(group, reduce_op, op)  # (Lightning's signature, and op=)

        if isinstance(tensor, DTensor):  # a loss computed under loss_parallel(): replicated, whole on every rank
            tensor = tensor.full_tensor()
        out = super().reduce(tensor, op=op)
        if op == "sum" and self.tensor_parallel_size > 1:
            out = out / self.tensor_parallel_size  # each tensor-parallel group counted once (see the module doc)
        return out

    def clip_gradients(self, optimizer, max_norm=None, max_value=None, norm_type=2.0, unscale=True):
        """The norm over every shard of every gradient. The gradients live on different meshes (a tensor-parallel
        layer's on the 2-D mesh, a layer that is only fully_shard-ed on the data-parallel one), and DTensor ops do not
        mix meshes: each mesh's gradients give one norm (reduced over its ranks), and those norms give the total."""
        from torch.distributed.tensor import DTensor

        if unscale:  # (False: as they are, the base contract's)
            self.unscale_gradients(optimizer)
        params = [p for p in self._in_module_order(optimizer) if p.grad is not None]
        if not params:
            return torch.tensor(0.0)
        by_mesh = {}  # in the order the meshes first come in the module
        for p in params:
            by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
        norms = []
        for group in by_mesh.values():
            norm = torch.nn.utils.get_total_norm([p.grad for p in group], norm_type)
            norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
        norm = norms[0] if len(norms) == 1 else torch.nn.utils.get_total_norm(norms, norm_type)
        for group in by_mesh.values():
            if max_norm is not None:
                torch.nn.utils.clip_grads_with_norm_(group, max_norm, norm)
            if max_value is not None:
                torch.nn.utils.clip_grad_value_(group, max_value)  # elementwise: each shard on its own is exact
        return norm

    # -- checkpoints ---------------------------------------------------------------------------------------------
    def _layout(self):
        layout = {"data_parallel": self.data_parallel_size, "tensor_parallel": self.tensor_parallel_size}
        if self.data_parallel_replicate_size > 1:
            layout["data_parallel_replicate"] = self.data_parallel_replicate_size
        return layout

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        checkpoint = with_own(checkpoint, device_mesh=self._layout())
        return super().save_checkpoint(checkpoint, filepath, storage_options)

    def save_checkpoint_into(self, directory, checkpoint, filename):
        checkpoint = with_own(checkpoint, device_mesh=self._layout())
        return super().save_checkpoint_into(directory, checkpoint, filename)

    def save_checkpoint_async(self, checkpoint, path, on_complete=None, filename=None):
        checkpoint = with_own(checkpoint, device_mesh=self._layout())
        return super().save_checkpoint_async(checkpoint, path, on_complete, filename)

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        path = checkpoint_path
        ckpt = super().load_checkpoint(path, weights_only)
        self._say_resharded(ckpt, path)
        return ckpt

    def load_checkpoint_from(self, directory, filename):
        ckpt = super().load_checkpoint_from(directory, filename)
        self._say_resharded(ckpt, directory)
        return ckpt

    def _say_resharded(self, ckpt, path):
        saved = own_state(ckpt).get("device_mesh") if isinstance(ckpt, dict) else None
        now = self._layout()
        if not self.is_global_zero or saved == now:
            return
        if saved is None:
            source = (f"{own_state(ckpt).get('world_size', '?')} processes (no mesh recorded: another strategy's "
                      "checkpoint)")
        else:
            source = _describe_layout(saved)
        print(f"[tasktrain] {path}: written on {source}, loaded onto {_describe_layout(now)}: weights and optimizer "
              "state resharded", flush=True)

    def teardown(self):
        super().teardown()  # the mesh stays with the process group, for the next stage

    def describe(self):
        dp, tp = (self.data_parallel_size, self.tensor_parallel_size) if self._layout_now else \
            (self._requested_sizes[0], self.tensor_parallel_size)
        checkpoint = "distributed (DCP)" if self.save_distributed_checkpoint else "one file"
        replicas = self.data_parallel_replicate_size
        hsdp = f" as {replicas} replicas (HSDP)" if replicas > 1 else ""
        return (f"strategy={self.name} (data_parallel={dp}{hsdp}, tensor_parallel={tp}, checkpoints {checkpoint}), "
                f"world_size={self.world_size}, device={self.root_device}")


def _describe_layout(layout):
    replicas = layout.get("data_parallel_replicate", 1)
    hsdp = f" as {replicas} replicas x {layout['data_parallel'] // replicas} shards" if replicas > 1 else ""
    return f"(data_parallel={layout['data_parallel']}{hsdp}, tensor_parallel={layout['tensor_parallel']})"


_META_ON_CPU = ("ModelParallelStrategy: a module on the meta device (init_module(empty_init=True), or layers built "
                "under torch.device('meta')) cannot be initialised on a CPU mesh: random initialisation of sharded "
                "DTensors on a CPU device mesh gives every rank the same values, so the shards would be copies of "
                "each other. Build the module with real weights (before parallelizing), or load its weights from a "
                "checkpoint into a module built normally; meta initialisation needs CUDA.")


@contextlib.contextmanager
def _loss_parallel():
    """torch's loss_parallel(), safe to nest with the user's own: torch's contexts do not nest (the inner one's exit
    removes the handlers, and the outer one's exit then fails with a KeyError), and users enter theirs around or
    inside backward (Lightning's example overrides the module's backward to run it under loss_parallel; an
    Accelerator script may write `with loss_parallel(): accelerator.backward(loss)`). This registers the handlers
    that are not registered yet, and removes those only, if still there (torch 2.13's own registry of them)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.parallel.loss import customized_loss_ops

    handlers = DTensor._op_dispatcher._custom_op_handlers
    added = {op: handler for op, handler in customized_loss_ops.items() if op not in handlers}
    handlers.update(added)
    try:
        yield
    finally:
        for op in added:
            handlers.pop(op, None)


def _defines_configure_model(module):
    """Whether a class of the module's own (not TaskModule, whose hook is empty) defines configure_model."""
    for cls in type(module).__mro__:
        if "configure_model" in vars(cls):
            return cls.__module__ != "tasktrain.trainer.module"
    return False


def _refuse_block_compile(module):
    """torch.compile of a submodule whose parameters are tensor-parallel DTensors (per-block compile)."""
    from torch.distributed.tensor import DTensor

    for name, sub in module.named_modules():
        compiled = type(sub).__name__ == "OptimizedModule" or getattr(sub, "_compiled_call_impl", None) is not None
        if name and compiled and any(isinstance(p, DTensor) for p in sub.parameters()):
            raise ValueError(f"ModelParallelStrategy: {name!r} is compiled on its own (torch.compile of a block) and "
                             "holds tensor-parallel parameters. On torch 2.13 the backward of such blocks fails "
                             "when they are tensor parallel only ('Tensor' object has no attribute "
                             "'_local_tensor'); with fully_shard too it ran in a one-step check, but it is not "
                             "tested through this strategy, so it is refused. Compile the whole model instead "
                             "(whole-model torch.compile was measured to work on a tensor-parallel model).")
