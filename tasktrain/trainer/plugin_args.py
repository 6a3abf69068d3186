"""Trainer(plugins=...): Lightning's plugin objects (tasktrain.plugins) sorted and checked as Lightning's accelerator
connector does (plugins_of, before the strategy is configured), then handed to the configured strategy
(apply_plugins: strategy.precision_plugin, strategy.checkpoint_io; the environment checked against the launcher's
variables, SLURMEnvironment's requeue settings returned for the fit's handler)."""
import signal
from dataclasses import dataclass

import torch


@dataclass
class Plugins:
    """Trainer(plugins=...), sorted as Lightning sorts them: one of each kind at most."""

    precision: object = None  # a Precision plugin (tasktrain.plugins.precision)
    checkpoint_io: object = None  # a CheckpointIO (tasktrain.plugins.io)
    environment: object = None  # a ClusterEnvironment (tasktrain.plugins.environments)
    layer_sync: object = None  # a LayerSync: TorchSyncBatchNorm (sync_batchnorm=True), or one of one's own


def plugins_of(plugins, precision, sync_batchnorm, strategy) -> Plugins:
    """Lightning's rules for `plugins=` (its accelerator connector's, with its exceptions and words): a plugin or an
    iterable of them; each a Precision, CheckpointIO, ClusterEnvironment or LayerSync; one of each kind; a precision
    plugin not beside precision= nor a strategy object's own precision. Checked before the strategy is configured."""
    from collections import Counter
    from collections.abc import Iterable

    from tasktrain.checkpoint_io import CheckpointIO
    from tasktrain.exceptions import MisconfigurationException
    from tasktrain.names import normalize_precision
    from tasktrain.plugins.environments import ClusterEnvironment
    from tasktrain.plugins.layer_sync import LayerSync, TorchSyncBatchNorm
    from tasktrain.strategies.base import Strategy
    from tasktrain.strategies.precision import Precision

    found = Plugins()
    if isinstance(strategy, Strategy) and isinstance(strategy._precision_choice, Precision):
        # a strategy's own precision plugin (DDPStrategy(precision_plugin=...)) is held to a plugin's rules too
        _check_plugin_classes(Plugins(precision=strategy._precision_choice))
    if plugins is None:
        return found
    plugins = plugins if isinstance(plugins, Iterable) else [plugins]  # (a string is an iterable of characters)
    if not plugins:
        return found
    kinds = Counter()
    for plugin in plugins:
        if isinstance(plugin, Precision):
            found.precision, kind = plugin, "Precision"
        elif isinstance(plugin, CheckpointIO):
            found.checkpoint_io, kind = plugin, "CheckpointIO"
        elif isinstance(plugin, ClusterEnvironment):
            found.environment, kind = plugin, "ClusterEnvironment"
        elif isinstance(plugin, LayerSync):
            if sync_batchnorm and not isinstance(plugin, TorchSyncBatchNorm):
                raise MisconfigurationException(
                    f"You set `Trainer(sync_batchnorm=True)` and provided a `{plugin.__class__.__name__}` plugin, but "
                    "this is not allowed. Choose one or the other.")
            found.layer_sync, kind = plugin, "TorchSyncBatchNorm"
        else:
            raise MisconfigurationException(
                f"Found invalid type for plugin {plugin}. Expected one of: Precision, CheckpointIO, ClusterEnvironment, "
                "or LayerSync. (tasktrain's are in tasktrain.plugins; a precision by name is precision=...)")
        kinds[kind] += 1
    duplicated = [kind for kind, count in kinds.items() if count > 1]
    if duplicated:
        raise MisconfigurationException(f"Received multiple values for {', '.join(duplicated)} flags in `plugins`. "
                                        "Expected one value for each type at most.")
    if found.precision is not None and precision is not None:
        raise ValueError(f"Received both `precision={normalize_precision(precision)}` and "
                         f"`plugins={found.precision}`. Choose one.")
    if isinstance(strategy, Strategy):
        if found.precision is not None and strategy.requested_precision is not None:
            raise MisconfigurationException("precision set through both strategy class and plugins, choose one")
        if found.checkpoint_io is not None and strategy.checkpoint_io_given:
            raise MisconfigurationException("checkpoint_io set through both strategy class and plugins, choose one")
        if found.environment is not None and strategy.cluster_environment is not None:
            # (Lightning keeps the strategy's and drops the plugin without a word)
            raise MisconfigurationException("cluster_environment set through both strategy class and plugins, "
                                            "choose one")
    _check_plugin_classes(found)
    return found


def _check_plugin_classes(found):
    """Subclasses of one's own: an engine strategy's plugin (DeepSpeedPrecision, FSDPPrecision) refuses overrides of
    ENGINE_REFUSED_HOOKS, saying why; Fabric's hooks that Lightning's Trainer never calls are warned about."""
    plugin = found.precision
    own = _own_methods(plugin)
    if own:
        from tasktrain.plugins.precision import ENGINE_REFUSED_HOOKS, UNCALLED_HOOKS

        refused = sorted(own & set(ENGINE_REFUSED_HOOKS)) if plugin.engine is not None else []
        if refused:
            raise ValueError(
                f"plugins=[{type(plugin).__name__}(...)] overrides {', '.join(refused)}: Lightning's FSDPPrecision "
                "builds FSDP1's MixedPrecision there for FSDP1's wrapper, and tasktrain's FSDP is torch's fully_shard "
                "(FSDP2), which takes a torch.distributed.fsdp.MixedPrecisionPolicy, so the override would not be "
                "called. Give the policy to the strategy: FSDPStrategy(mixed_precision=MixedPrecisionPolicy(...)).")
        uncalled = sorted(own & set(UNCALLED_HOOKS))
        if uncalled:
            import warnings

            warnings.warn(f"plugins=[{type(plugin).__name__}(...)] overrides {', '.join(uncalled)}: Fabric calls "
                          f"{'them' if len(uncalled) > 1 else 'it'}, Lightning's Trainer does not, nor does "
                          "tasktrain's. Cast step outputs in the module's steps; unscaling happens before "
                          "on_before_optimizer_step and the clipping.", UserWarning, stacklevel=4)
    _check_environment_class(found.environment)


def _own_methods(plugin) -> set:
    """The methods a subclass of one's own defines (its classes outside tasktrain), or an empty set."""
    if plugin is None:
        return set()
    return {name for cls in type(plugin).__mro__ if not cls.__module__.startswith("tasktrain.") and cls is not object
            for name, value in vars(cls).items() if callable(value) or isinstance(value, (property, staticmethod))}


def _users_environment(env) -> bool:
    """An environment that drives the world from its getters: a ClusterEnvironment subclass of one's own (not one of
    tasktrain.plugins.environments), or Kubeflow / LSF / MPI, which read their cluster's variables themselves."""
    from tasktrain.plugins.environments import _GivesItsRanks

    return env is not None and (type(env).__module__ != "tasktrain.plugins.environments"
                                or isinstance(env, _GivesItsRanks))


def _check_environment_class(env):
    from tasktrain.plugins.environments import _Refused

    if isinstance(env, _Refused) and not _users_environment(env):
        env.check(None)  # Lightning's XLAEnvironment: the refusal


def _connector_environment(env):
    """The environment Lightning's connector picks where none is given and LSF / MPI are not detected: torchrun's
    (TorchElasticEnvironment) where torchrun started the process, SLURM's where srun did, else LightningEnvironment.
    tasktrain still reads the launcher's variables itself (strategies/environment.py): the object says which launcher
    that is and gives Lightning's getters."""
    from tasktrain.plugins.environments import LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment

    if torch.distributed.is_torchelastic_launched():
        return TorchElasticEnvironment()
    if env.launcher == "slurm":
        from tasktrain.strategies import requeue

        try:
            sig = requeue.requeue_signal()
        except ValueError:
            sig = None  # (a bad TASKTRAIN_REQUEUE_SIGNAL is raised where the run installs its handler)
        slurm = SLURMEnvironment.__new__(SLURMEnvironment)  # (srun started this process: no hint to give)
        slurm.auto_requeue, slurm.requeue_signal = sig is not None, sig or signal.SIGUSR1
        return slurm
    return LightningEnvironment()


def tell_ranks(strategy):
    """Lightning's set_world_ranks when its multi-process strategy is built: the environment is given the strategy's
    rank and world size (a LightningEnvironment keeps them; the others read their cluster's and ignore them) and
    rank_zero_only.rank is the strategy's rank from then on (0 for a plain `python train.py` whatever RANK says:
    Lightning's LightningEnvironment reads LOCAL_RANK and NODE_RANK only)."""
    from tasktrain.trainer.runtime import announce_rank

    rank = strategy.global_rank
    strategy.cluster_environment.set_global_rank(rank)
    strategy.cluster_environment.set_world_size(strategy.world_size)
    announce_rank(rank)


def apply_plugins(found, strategy, env):
    """Hand the sorted plugins to the configured strategy (Lightning's strategy.precision_plugin /
    strategy.checkpoint_io) and check the environment plugin against the launcher's variables. Returns the SLURM
    requeue settings a SLURMEnvironment gives ((auto_requeue, signal)), or None."""
    from tasktrain.strategies.precision import Precision

    choice = strategy._precision_choice
    if (isinstance(choice, Precision) and strategy.precision_plugin is not choice
            and _own_methods(choice) - {"__init__"}):
        # a strategy's precision_plugin= that its engine replaced by its own plugin of that name (a MixedPrecision
        # subclass given to DeepSpeedStrategy): its methods would not be called
        raise ValueError(f"{type(strategy).__name__}(precision_plugin={type(choice).__name__}(...)): the strategy runs "
                         "its engine's own precision plugin of that name, so the methods of this one would not be "
                         f"called. Use precision={choice.name!r} without a subclass, or subclass its engine's "
                         "plugin (DeepSpeedPrecision, FSDPPrecision).")
    if found.precision is not None:
        strategy.precision_plugin = found.precision
        # (an engine's plugin of the same engine is the strategy's precision_plugin, its hooks attached to the
        # engine's own: another plugin under an engine strategy names a precision only)
        if strategy.precision_plugin is not found.precision and _own_methods(found.precision) - {"__init__"}:
            raise ValueError(f"plugins=[{type(found.precision).__name__}(...)]: {type(strategy).__name__} runs "
                             "its own precision plugin of that name, so the methods of this one would not be called. "
                             f"Use precision={found.precision.name!r} without a subclass.")
    if found.checkpoint_io is not None:
        strategy.checkpoint_io = found.checkpoint_io
    from tasktrain.plugins.environments import SLURMEnvironment, detected_environment

    from tasktrain.strategies.base import MultiProcess
    from tasktrain.trainer.runtime import announce_rank

    given = found.environment or strategy.cluster_environment  # plugins=[...], or the strategy's constructor's
    if given is None and env.launcher is None:  # Lightning's connector detects LSF and MPI after torchrun and SLURM
        given = detected_environment()
    if given is None:  # (torchrun's or SLURM's variables, or none, are read: tasktrain/strategies/environment.py)
        if isinstance(strategy, MultiProcess):  # (Lightning's one-process strategies hold no environment)
            strategy.cluster_environment = _connector_environment(env)
            tell_ranks(strategy)
        return None
    _check_environment_class(given)
    strategy.cluster_environment = given
    if _users_environment(given):  # its ranks, address and port form the process group (strategies/world.py)
        strategy.environment_plugin = given
        strategy.set_world_ranks()  # (Lightning's strategy tells it the ranks when built; read from it from here on)
        if isinstance(strategy, MultiProcess) and isinstance(strategy.global_rank, int):
            announce_rank(strategy.global_rank)  # (Lightning's rank_zero_only.rank, set there too)
        return None
    given.check(env)
    if isinstance(strategy, MultiProcess):
        tell_ranks(strategy)
    if isinstance(given, SLURMEnvironment):
        return given.auto_requeue, given.requeue_signal
    return None
