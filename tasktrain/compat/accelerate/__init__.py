"""Accelerate's layer (see tasktrain/compat/__init__.py): accelerator.py (the Accelerator with Accelerate's
constructor), state.py (`accelerate.state`), utils/ (`accelerate.utils`), layout.py (Accelerate's save_state files)."""
