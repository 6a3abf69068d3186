"""Lightning's module path `lightning.pytorch.trainer.connectors`, kept for the one name scripts and tests patch there:
`callback_connector._RICH_AVAILABLE`. tasktrain has no connector objects (the Trainer's connector attributes are
views, in trainer/lightning_connectors.py); nothing else lives here."""
