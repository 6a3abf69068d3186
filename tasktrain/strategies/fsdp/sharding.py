"""How FSDP2 (fully_shard) is applied and fed: the precision policy, the units to wrap, shared weights, meta-device
modules, loading from rank 0, optimizers pointed at the shards, and the gradients a skipped sync leaves."""
import torch
import torch.distributed as dist


_HALF = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16, "bf16-true": torch.bfloat16,
         "16-true": torch.float16}


def _check_policy(policy, precision):
    """A user's MixedPrecisionPolicy beside the run's precision: the policy decides FSDP's casting, the precision the
    rest (autocast, the scaler, the stored dtype); a pair that says two different things is refused."""
    half = _HALF.get(precision)
    param = policy.param_dtype
    if precision == "32-true" or param is None or param == half:
        return
    if precision.endswith("-mixed") and param == torch.float32:
        return  # fp32 compute copies with autocast on top: Lightning's FSDP mixed precision
    raise ValueError(f"FSDP(mixed_precision=MixedPrecisionPolicy(param_dtype={param})) contradicts precision="
                     f"{precision!r}, which computes in {half}. Give param_dtype={half} (or None), or use "
                     "precision='32-true' to run the policy alone.")


def _describe_policy(policy):
    fields = ("param_dtype", "reduce_dtype", "output_dtype")
    said = [f"{f}={str(getattr(policy, f)).replace('torch.', '')}" for f in fields if getattr(policy, f) is not None]
    if not policy.cast_forward_inputs:
        said.append("cast_forward_inputs=False")
    return f"MixedPrecisionPolicy({', '.join(said)})"


def _is_class_set(wrap):
    """A set of module classes, or of class names (strings: how a launch config names them); empty: none."""
    return isinstance(wrap, (set, frozenset, list, tuple)) and all(
        isinstance(c, str) or (isinstance(c, type) and issubclass(c, torch.nn.Module)) for c in wrap)


def _children_with_parameters(module, prefix=""):
    names = []
    for name, child in module.named_children():
        if not any(True for _ in child.parameters()):
            continue
        if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
            names += _children_with_parameters(child, f"{prefix}{name}.")
        else:
            names.append(f"{prefix}{name}")
    return names


def _shared_between(module, targets):
    """The targets holding a parameter that a module outside them holds too (tied weights): such a parameter would be
    sharded by the target's unit while the other module uses it outside that unit's forward."""
    owners = {}  # id(parameter) -> names of the modules holding it directly
    for name, m in module.named_modules():
        for p in m.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(name)
    shared = set()
    for target in targets:
        inside = target + "."
        for p in module.get_submodule(target).parameters():
            if any(o != target and not o.startswith(inside) for o in owners[id(p)]):
                shared.add(target)
    return shared


def _drop_unreduced_gradients(module):
    """The gradients of backward passes run without sync, which FSDP2 keeps per parameter, unsharded, until the next
    synced backward reduce-scatters them with its own (torch's FSDPParam: unsharded_accumulated_grad, or the
    unsharded parameter's .grad in fp32)."""
    for m in module.modules():
        get_state = getattr(m, "_get_fsdp_state", None)
        group = get_state()._fsdp_param_group if get_state is not None else None
        for fsdp_param in group.fsdp_params if group is not None else ():
            fsdp_param.unsharded_accumulated_grad = None
            unsharded = getattr(fsdp_param, "_unsharded_param", None)
            if unsharded is not None:
                unsharded.grad = None


def _is_sharded(module):
    from torch.distributed.fsdp import FSDPModule

    return isinstance(module, FSDPModule)


def _holds_dtensors(obj):
    from torch.distributed.tensor import DTensor

    if isinstance(obj, DTensor):
        return True
    if isinstance(obj, dict):
        return any(_holds_dtensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_holds_dtensors(v) for v in obj)
    return False


def _keyed_by_name(state):
    return isinstance(state, dict) and all(isinstance(k, str) for k in state.get("state", {}))


def _full(tensor):
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _own_tensors(module):
    return [*module.parameters(recurse=False), *module.buffers(recurse=False)]


def _on_meta(module):
    return any(t.is_meta for t in [*module.parameters(), *module.buffers()])


def _check_resettable(module):
    """A module built on the meta device is initialised by reset_parameters(): each submodule holding tensors of its
    own must have one (checked before anything is allocated)."""
    missing = [name or type(module).__name__ for name, m in module.named_modules()
               if _own_tensors(m) and not callable(getattr(m, "reset_parameters", None))]
    if missing:
        raise ValueError(f"FSDP: the module was built with init_module(empty_init=True) (on the meta device), and "
                         f"{missing[:5]} hold parameters or buffers of their own but define no reset_parameters() to "
                         "initialise them. Define reset_parameters() on them (nn.Linear-style: fill the tensors in "
                         "place), or build the module without empty_init.")


def _materialize(module, device):
    """Allocate each rank's shards (the parameters are DTensors by now: to_empty makes their local shards only) and
    initialise them in place with every submodule's reset_parameters()."""
    module.to_empty(device=device)
    with torch.no_grad():
        for m in module.modules():
            if _own_tensors(m):
                m.reset_parameters()


def _load_from_rank0(module, whole, device, on_meta):
    """Fill every rank's shards with rank 0's whole weights (`whole`, its state dict before sharding; {} on the
    others), and its buffers (a state dict lacks the non-persistent ones)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    if on_meta:
        module.to_empty(device=device)  # this rank's shards and buffers, uninitialised: rank 0's values come next
    set_model_state_dict(module, whole, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    if dist.is_initialized():
        with torch.no_grad():
            for buffer in module.buffers():
                dist.broadcast(buffer, src=0)


def _check_optimizer(optimizer, names):
    """The optimizer is pointed at the sharded parameters after fully_shard: it must step the module's parameters
    only, and must not have stepped yet (its state is keyed by the old parameters)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if id(p) not in names:
                raise ValueError(f"FSDP: {type(optimizer).__name__} steps a parameter that is not one of the module's "
                                 "(shape {tuple(p.shape)}): under FSDP an optimizer steps the parameters of the "
                                 "module it is set up with.")
    if any(len(s) for s in optimizer.state.values()):
        raise ValueError(f"FSDP: {type(optimizer).__name__} has stepped already (it holds state for the unsharded "
                         "parameters). Set it up with the module before its first step (prepare them together).")


def _steps_only_ids(optimizer, ids):
    params = [p for group in optimizer.param_groups for p in group["params"]]
    return bool(params) and all(id(p) in ids for p in params)


def _repoint_optimizer(optimizer, names, params):
    """fully_shard replaced the parameters by sharded ones (DTensors): the same optimizer object, with the same
    groups and hyper-parameters, now steps the new ones."""
    for group in optimizer.param_groups:
        group["params"] = [params[names[id(p)]] for p in group["params"]]
    optimizer.state.clear()
