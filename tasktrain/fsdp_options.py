"""Accelerate's FSDP options (FullyShardedDataParallelPlugin's fields, a launch YAML's `fsdp_config:` keys) mapped onto
tasktrain's FSDP(...) arguments: one table for the Accelerator's plugin and for `tasktrain launch`.

Plain Python (no torch): the launcher reads it before any process starts. `fsdp_options(values)` takes the
plugin's field names (a YAML's keys without their `fsdp_` prefix) and returns (FSDP keyword arguments, the fields
given that do nothing here with why); a value tasktrain cannot run is a ValueError naming what to do instead.
The arguments are JSON values (the launcher passes them to the workers in TASKTRAIN_FSDP), but for a plugin's
torch MixedPrecisionPolicy, which only a script can give.
"""

# Fields that change nothing under tasktrain's FSDP (FSDP2), with why: reported as ignored, never an error.
IGNORED = {
    "use_orig_params": "FSDP2 always keeps the original parameters",
    "sync_module_states": "every rank builds the module from the same seed (or on the meta device)",
    "backward_prefetch": "FSDP2 prefetches by itself",
    "forward_prefetch": "FSDP2 prefetches by itself",
    "limit_all_gathers": "FSDP2 limits its all-gathers by itself",
    "state_dict_config": "get_state_dict gathers the whole weights on every rank; save_state writes shards",
    "optim_state_dict_config": "save_state writes the optimizer's shards",
    "min_num_params": "only for SIZE_BASED_WRAP, which is not available",
}
# Fields with a meaning here (the values tasktrain runs are mapped; others are errors naming the fix).
USED = ("fsdp_version", "reshard_after_forward", "sharding_strategy", "cpu_offload", "offload_params",
        "state_dict_type", "auto_wrap_policy", "transformer_cls_names_to_wrap", "transformer_layer_cls_to_wrap",
        "activation_checkpointing", "cpu_ram_efficient_loading", "mixed_precision_policy", "ignored_modules",
        "param_init_fn")
_TRUE = (True, "true", "True", "TRUE", 1, "1")
_FALSE = (False, "false", "False", "FALSE", 0, "0", None, "")


def fsdp_options(values, where="FullyShardedDataParallelPlugin", yaml=False):
    """(FSDP(...) keyword arguments, {field: why it is ignored}) for Accelerate's FSDP fields in `values` (yaml=True:
    errors name the keys as a launch YAML's fsdp_config writes them, `fsdp_` first)."""
    unknown = sorted(set(values) - set(USED) - set(IGNORED))
    if unknown:
        raise ValueError(f"{where}: unknown FSDP option(s) {unknown}. Known: {', '.join(sorted([*USED, *IGNORED]))}.")
    kwargs, ignored = {}, {}
    for key, value in values.items():
        if key in IGNORED and value is not None:
            ignored[key] = IGNORED[key]

    def refuse(key, fix):
        shown = yaml_key(key) if yaml else key
        raise ValueError(f"{where}: {shown}: {values[key]!r} is not supported: {fix}.")

    version = values.get("fsdp_version")
    if version not in (None, 2, "2"):
        refuse("fsdp_version", "tasktrain's FSDP is FSDP2 (torch's fully_shard): set fsdp_version: 2")
    reshard = values.get("reshard_after_forward")
    sharding = values.get("sharding_strategy")
    if sharding not in (None, "FULL_SHARD", 1, "1", "SHARD_GRAD_OP", 2, "2"):
        refuse("sharding_strategy", "tasktrain's FSDP shards parameters, gradients and optimizer state "
                                    "(FULL_SHARD, or SHARD_GRAD_OP: no resharding after forward); use DDP otherwise")
    if reshard is None and sharding is not None:
        reshard = "FULL_SHARD" if sharding in ("FULL_SHARD", 1, "1") else "SHARD_GRAD_OP"
    if reshard in (*_TRUE, "FULL_SHARD"):
        kwargs["reshard_after_forward"] = True
    elif reshard in (False, "false", "False", "SHARD_GRAD_OP"):
        kwargs["reshard_after_forward"] = False
    elif reshard is not None:
        refuse("reshard_after_forward", "use true (FULL_SHARD) or false (SHARD_GRAD_OP)")
    for key in ("cpu_offload", "offload_params"):
        value = values.get(key)
        if value in _TRUE:
            kwargs["cpu_offload"] = True
        elif value not in _FALSE:
            refuse(key, "use true or false (torch's CPUOffloadPolicy: the shards live in CPU memory)")
    state_dict_type = values.get("state_dict_type")
    if state_dict_type in ("SHARDED_STATE_DICT", "sharded"):
        kwargs["state_dict_type"] = "sharded"
    elif state_dict_type in ("FULL_STATE_DICT", "full"):
        kwargs["state_dict_type"] = "full"
    elif state_dict_type is not None:
        refuse("state_dict_type", "use SHARDED_STATE_DICT (a directory every rank writes) or FULL_STATE_DICT (one "
                                  "file rank 0 writes)")
    names_field = "fsdp_transformer_layer_cls_to_wrap" if yaml else "transformer_cls_names_to_wrap"
    names = values.get("transformer_cls_names_to_wrap") or values.get("transformer_layer_cls_to_wrap")
    items = names if isinstance(names, (list, tuple)) else str(names or "").split(",")
    names = list(dict.fromkeys(str(n).strip() for n in items if str(n).strip()))  # as given, once each
    policy = values.get("auto_wrap_policy")
    policy_field = yaml_key("auto_wrap_policy") if yaml else "auto_wrap_policy"
    if policy in ("TRANSFORMER_BASED_WRAP", "transformer_based_wrap") or (policy is None and names):
        if not names:
            raise ValueError(f"{where}: {policy_field}: TRANSFORMER_BASED_WRAP needs {names_field} (the class names of "
                             "the model's repeated blocks, e.g. GPT2Block), or pass strategy=FSDP(wrap={YourBlock}) "
                             "in the script.")
        kwargs["wrap"] = names
    elif policy in ("NO_WRAP", "no_wrap"):
        if names:
            raise ValueError(f"{where}: {policy_field} NO_WRAP and {names_field} {','.join(names)} say two things: "
                             f"use TRANSFORMER_BASED_WRAP to wrap those classes, or drop {names_field}.")
        kwargs["wrap"] = []  # the root alone: one unit
    elif policy is not None:
        refuse("auto_wrap_policy", "use TRANSFORMER_BASED_WRAP with the block class names, NO_WRAP, or leave it unset "
                                   "(each child module that holds parameters gets its own unit); in a script, "
                                   "FSDP(wrap=...) also takes a callable")
    checkpointing = values.get("activation_checkpointing")
    if checkpointing in _TRUE:
        # Accelerate recomputes the classes its wrap policy names: the same block classes here
        if not names:
            field = yaml_key("activation_checkpointing") if yaml else "activation_checkpointing"
            raise ValueError(f"{where}: {field}: true needs {names_field} (the block classes to recompute in the "
                             "backward), or pass strategy=FSDP(activation_checkpointing={YourBlock}) in the script.")
        kwargs["activation_checkpointing"] = names
    elif checkpointing not in _FALSE:
        refuse("activation_checkpointing", "use true (the wrapped block classes recompute their forward in the "
                                           "backward) or false")
    loading = values.get("cpu_ram_efficient_loading")
    if loading in _TRUE:
        kwargs["cpu_ram_efficient_loading"] = True  # every rank starts from rank 0's weights (FSDP's docstring)
    elif loading not in _FALSE:
        refuse("cpu_ram_efficient_loading", "use true (rank 0's weights are broadcast to every rank at setup; the "
                                            "others build the model on the meta device under init_module()) or false")
    policy = values.get("mixed_precision_policy")
    if type(policy).__name__ == "MixedPrecisionPolicy":  # torch's own (the plugin; a YAML cannot hold one)
        kwargs["mixed_precision"] = policy
    elif policy is not None:
        refuse("mixed_precision_policy", "give torch.distributed.fsdp.MixedPrecisionPolicy(...), or choose the "
                                         "precision with mixed_precision='bf16' (fp32 shards, bf16 compute, fp32 "
                                         "gradient reduction)")
    for key, fix in (("ignored_modules", "every parameter is sharded; move modules that must stay whole out of the "
                                         "model"),
                     ("param_init_fn", "a module built on the meta device is initialised by each submodule's "
                                       "reset_parameters()")):
        if values.get(key) is not None:
            refuse(key, fix)
    return kwargs, ignored


def yaml_key(field):
    """The fsdp_config key of a plugin field (fsdp_version is written once)."""
    return field if field.startswith("fsdp_") else f"fsdp_{field}"
