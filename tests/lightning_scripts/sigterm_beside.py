"""SIGTERM sent to the process itself from a callback hook at one batch, in fit (mid-epoch, at an epoch's last batch,
inside its validation, inside its sanity check, with a ModelCheckpoint), validate, test (at the last batch), predict,
and a fit whose ModelCheckpoint(save_on_exception=True) saves. `run_cases(framework, root)` ("lightning" or
"tasktrain") returns per case the hooks called (with trainer.received_sigterm at each), what the entry point did, the
flag after it, the trainer's status, the calls of the SIGTERM handler the script had before, whether it was given
back, and the files written: tests/test_lightning_beside_sigterm.py compares them. As a script
(`python sigterm_beside.py FRAMEWORK ROOT`), the last case alone, its SIGTERMException left uncaught: the process's
exit status is what a Lightning user's script gets."""
import importlib
import os
import signal
import sys

from torch.utils.data import DataLoader

HOOKS = ("setup", "teardown", "on_fit_start", "on_fit_end", "on_sanity_check_start", "on_sanity_check_end",
         "on_train_start", "on_train_end", "on_train_epoch_start", "on_train_epoch_end", "on_train_batch_start",
         "on_train_batch_end", "on_validation_start", "on_validation_end", "on_validation_epoch_start",
         "on_validation_epoch_end", "on_validation_batch_start", "on_validation_batch_end", "on_test_start",
         "on_test_end", "on_test_batch_start", "on_test_batch_end", "on_predict_start", "on_predict_end",
         "on_predict_batch_start", "on_predict_batch_end", "on_save_checkpoint", "on_exception")


def recorder(lib, seen, at):
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


def case(lib, records, root, name, entry, at, catch=True, **trainer_args):
    if lib.__name__.startswith("lightning"):
        from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
        from lightning.pytorch.utilities.exceptions import SIGTERMException
    else:
        from tasktrain.demos.boring_classes import BoringModel, RandomDataset
        from tasktrain.utilities.exceptions import SIGTERMException
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
    callbacks = [recorder(lib, seen, at)] + args.pop("callbacks", [])
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


def last_case(lib, records, root, catch=True):
    case(lib, records, root, "fit_save_on_exception", "fit", ("on_train_batch_end", 1, False), catch=catch,
         callbacks=[lib.callbacks.ModelCheckpoint(save_on_exception=True)], enable_checkpointing=True)


def run_cases(framework, root):
    lib = importlib.import_module("lightning.pytorch" if framework == "lightning" else "tasktrain")
    records = {}
    case(lib, records, root, "fit_mid_epoch", "fit", ("on_train_batch_start", 1, False))
    case(lib, records, root, "fit_last_batch_of_epoch", "fit", ("on_train_batch_end", 3, False))
    case(lib, records, root, "fit_in_validation", "fit", ("on_validation_batch_start", 0, False))
    case(lib, records, root, "fit_in_sanity_check", "fit", ("on_validation_batch_end", 0, True),
         num_sanity_val_steps=2)
    case(lib, records, root, "fit_with_checkpointing", "fit", ("on_train_batch_end", 1, False),
         enable_checkpointing=True)
    case(lib, records, root, "validate", "validate", ("on_validation_batch_end", 0, False))
    case(lib, records, root, "test_last_batch", "test", ("on_test_batch_end", 2, False))
    case(lib, records, root, "predict", "predict", ("on_predict_batch_start", 0, False))
    last_case(lib, records, root)
    return records


if __name__ == "__main__":
    framework, root = sys.argv[1:3]
    last_case(importlib.import_module("lightning.pytorch" if framework == "lightning" else "tasktrain"), {}, root,
              catch=False)
    print("not reached", flush=True)
