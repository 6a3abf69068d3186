"""The compatibility layers: other frameworks' names, aliases, refusals and file layouts, one package per framework,
on top of the core (strategies, runtime, run state, epoch iterator, the Trainer's and the Accelerator's loops).

    tasktrain/compat/accelerate/   Accelerate: the Accelerator under Accelerate's constructor (its plugins, kwargs
                                   handlers and configuration objects), PartialState/AcceleratorState, the
                                   `accelerate.utils` names, Accelerate's save_state files
    tasktrain/compat/lightning/    Lightning: `lightning.pytorch.utilities` (rank_zero_*, types, ...) and `.core`

They import the core; the core never imports them (tests/test_contract.py reads it from the source). The module
paths scripts use after the rename (tasktrain.state, tasktrain.utils, tasktrain.utilities, ...) are these modules.
"""
