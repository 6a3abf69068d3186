"""`lightning.pytorch.utilities.argparse`: Lightning keeps only private helpers here (the PL_TRAINER_* environment
defaults of Trainer arguments, which tasktrain does not read: pass the arguments, or use TaskCLI's config files and
`--trainer.*` options). The module exists so that `import ...utilities.argparse` works; it has no public names."""
__all__ = []
