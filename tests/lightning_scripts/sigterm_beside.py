"""One process, one framework (argv[1]: lightning | tasktrain): SIGTERM sent to itself from a callback hook at one
batch, in fit (mid-epoch, at an epoch's last batch, inside its validation, inside its sanity check), validate, test
(at the last batch) and predict; then, left uncaught, a fit whose ModelCheckpoint(save_on_exception=True) saves.
Writes argv[3] (JSON) at exit: per case the hooks called (with trainer.received_sigterm at each), what the entry point
did, the flag after it, the calls of the SIGTERM handler the script had before, whether it was given back, and the
files written. tests/test_lightning_beside_sigterm.py runs it under both and compares."""
import atexit
import json
import os
import signal
import sys

import torch
from torch.utils.data import DataLoader

framework, root, out = sys.argv[1:4]
if framework == "lightning":
    import lightning.pytorch as lib
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
    from lightning.pytorch.utilities.exceptions import SIGTERMException
else:
    import tasktrain as lib
    from tasktrain.demos.boring_classes import BoringModel, RandomDataset
    from tasktrain.utilities.exceptions import SIGTERMException

HOOKS = ("setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
         "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
         "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
         "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start",
         "on_test_end", "on_test_batch_start", "on_test_batch_end", "on_predict_start", "on_predict_end",
         "on_predict_batch_start", "on_predict_batch_end", "on_save_checkpoint", "on_exception")
records = {}
atexit.register(lambda: json.dump(records, open(out, "w"), indent=1))  # (also when the last case exits the process)


def recorder(seen, at):
    """Every hook as (name, batch_idx or None, received_sigterm); SIGTERM once at (hook name, batch_idx, sanity)."""
    def make(name):
        def hook(self, trainer, module, *args, **kwargs):
            batch_idx = args[-1] if name.endswith(("batch_start", "batch_end")) else None
            if name == "on_exception":
                batch_idx = [type(args[0]).__name__, trainer.global_step, trainer.current_epoch]
            seen.append([name, batch_idx, trainer.received_sigterm])
            if (name, batch_idx, trainer.sanity_checking) == at:
                os.kill(os.getpid(), signal.SIGTERM)
        return hook
    return type("Recorder", (lib.Callback,), {name: make(name) for name in HOOKS})()


def case(name, entry, at, catch=True, **trainer_args):
    folder = os.path.join(root, name)
    seen, user_calls = [], []
    record = records[name] = dict(hooks=seen)

    def users_handler(signum, frame):  # the script's own handler, there before the run
        user_calls.append(signum)

    signal.signal(signal.SIGTERM, users_handler)
    args = dict(max_epochs=2, limit_train_batches=4, limit_val_batches=2, limit_test_batches=3,
                limit_predict_batches=3, num_sanity_val_steps=0, logger=False, enable_progress_bar=False,
                enable_model_summary=False, enable_checkpointing=False, default_root_dir=folder)
    args.update(trainer_args)
    callbacks = [recorder(seen, at)] + args.pop("callbacks", [])
    trainer = lib.Trainer(callbacks=callbacks, **args)
    model = BoringModel()
    loader = DataLoader(RandomDataset(32, 64), batch_size=2)
    try:
        if entry == "fit":
            trainer.fit(model, loader, loader)
        elif entry == "predict":
            record["predictions"] = len(trainer.predict(model, loader))
        else:
            getattr(trainer, entry)(model, loader, verbose=False)
        record["outcome"] = "returned"
    except SIGTERMException as exc:
        record["outcome"] = ["SIGTERMException", exc.code]
        if not catch:
            raise
    finally:
        record.update(after=trainer.received_sigterm, status=str(trainer.state.status.value),
                      user_handler_calls=len(user_calls),
                      handler_back=signal.getsignal(signal.SIGTERM) is users_handler,
                      files=sorted(os.path.relpath(os.path.join(d, f), folder)
                                   for d, _, files in os.walk(folder) for f in files),
                      global_step=trainer.global_step)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


case("fit_mid_epoch", "fit", ("on_train_batch_start", 1, False))
case("fit_last_batch_of_epoch", "fit", ("on_train_batch_end", 3, False))
case("fit_in_validation", "fit", ("on_validation_batch_start", 0, False))
case("fit_in_sanity_check", "fit", ("on_validation_batch_end", 0, True), num_sanity_val_steps=2)
case("fit_with_checkpointing", "fit", ("on_train_batch_end", 1, False), enable_checkpointing=True)
case("validate", "validate", ("on_validation_batch_end", 0, False))
case("test_last_batch", "test", ("on_test_batch_end", 2, False))
case("predict", "predict", ("on_predict_batch_start", 0, False))
case("fit_save_on_exception_uncaught", "fit", ("on_train_batch_end", 1, False), catch=False,
     callbacks=[lib.callbacks.ModelCheckpoint(save_on_exception=True)], enable_checkpointing=True)
records["not reached"] = True
