import warnings


class MisconfigurationException(ValueError):
    """A configuration that cannot work (Lightning's name for it). A ValueError, so that code catching ValueError
    for a bad argument keeps catching it."""


class PossibleUserWarning(UserWarning):
    """A warning about a setting that may be a mistake (Lightning's class, `lightning.pytorch.utilities.warnings`):
    filter it with warnings.filterwarnings("ignore", category=PossibleUserWarning) where it is not."""


class LightningDeprecationWarning(DeprecationWarning):
    """A deprecation Lightning announced, which tasktrain follows (Lightning's class,
    `lightning.pytorch.utilities.rank_zero`; rank_zero_deprecation's category): `TaskModule.to_torchscript`. Shown
    once per place by default, as Lightning's filter shows it (Python hides a DeprecationWarning outside __main__)."""


warnings.simplefilter("default", category=LightningDeprecationWarning)


class SIGTERMException(SystemExit):
    """The run received SIGTERM (Lightning's class, `lightning.pytorch.utilities.exceptions`): raised by the loops at
    Lightning's points (after a training batch, at an epoch's end, after an evaluation batch that is not the last),
    so that the on_exception hooks run (an OnExceptionCheckpoint or ModelCheckpoint(save_on_exception=True) saves
    there); a SystemExit without a code, so a script that does not catch it exits with status 0."""


class _TunerExitException(Exception):
    """Raised by a finder callback the Tuner added (Lightning's name, `lightning.pytorch.utilities.exceptions`) once
    its search is done: the run the Tuner started ends there as a finished run (its teardown hooks, status FINISHED),
    without training on (Tuner.lr_find / scale_batch_size run the search inside a real run, as Lightning's)."""
