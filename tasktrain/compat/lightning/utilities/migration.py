"""`lightning.pytorch.utilities.migration`: migrate_checkpoint and pl_legacy_patch, on tasktrain's terms.

Lightning's migrations rewrite checkpoints written by older Lightning versions, and pl_legacy_patch lets the unpickler
find classes older Lightning versions pickled. tasktrain's files carry their own format version (under "loops"):
migrate_checkpoint brings a tasktrain checkpoint dict of an older format to the current layout (what loading does
anyway), and refuses a dict tasktrain did not write, whose history only Lightning knows. pl_legacy_patch does nothing,
truthfully: tasktrain loads with torch.load(weights_only=True), so no class is ever unpickled that could need one."""
import contextlib

from tasktrain import checkpoint_io

__all__ = ["migrate_checkpoint", "pl_legacy_patch"]


def migrate_checkpoint(checkpoint, target_version=None):
    """(checkpoint, {format: [what was applied]}): the dict upgraded in place to the current tasktrain format."""
    if target_version is not None:
        raise ValueError(f"migrate_checkpoint(target_version={target_version!r}): tasktrain's files are versioned by "
                         "their own format, not by Lightning version; leave target_version out.")
    old_trainer_file = "state_dict" in checkpoint and isinstance(checkpoint.get("train_state"), dict)
    if checkpoint_io.format_version(checkpoint) is None and not old_trainer_file:
        raise ValueError(
            "migrate_checkpoint: this checkpoint was not written by tasktrain (no format version under 'loops'). "
            "Lightning's migrations are for files Lightning wrote: upgrade it with Lightning itself "
            "(`python -m lightning.pytorch.utilities.upgrade_checkpoint PATH`), then load only its weights "
            "(checkpoint['state_dict']) into your TaskModule.")
    upgraded = checkpoint_io.upgrade_layout(checkpoint)
    if upgraded is checkpoint:
        return checkpoint, {}
    checkpoint.clear()  # in place, as Lightning's (no copy of a large checkpoint kept alive)
    checkpoint.update(upgraded)
    return checkpoint, {str(checkpoint_io.CHECKPOINT_FORMAT_VERSION): ["upgrade_layout"]}


@contextlib.contextmanager
def pl_legacy_patch():
    """A no-op context: tasktrain never unpickles classes (weights_only=True loads), so there is nothing to patch."""
    yield
