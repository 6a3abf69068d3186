from setuptools import find_packages, setup

setup(
    name="tasktrain",
    version="0.1.0",
    description="A thin, honest PyTorch trainer: Trainer, Accelerator, launcher, DeepSpeed and device maps.",
    packages=find_packages(include=["tasktrain", "tasktrain.*"]),
    python_requires=">=3.10",
    # torch is pinned by the Makefile before this runs; a range here installs nothing more. The ranges are the
    # releases the tests have run on: a torch or DeepSpeed release that behaves differently (DeepSpeed has changed
    # dtype and clipping defaults between minor releases) is not picked up silently.
    # safetensors: reading and writing Hugging Face checkpoints (tasktrain.inference); imported only when used.
    install_requires=["torch>=2.13,<2.14", "deepspeed>=0.19.8,<0.20", "tqdm", "tensorboard", "pyyaml",
                      "safetensors>=0.8,<0.9"],
    # Optional integrations, imported only when their logger/tracker is created; from the releases the tests ran
    # on (requirements-dev.txt) to the next major one. mlflow-skinny is MLflow's client without the server and UI;
    # sqlalchemy and alembic let it use MLflow's default local store (sqlite).
    extras_require={
        "wandb": ["wandb>=0.31,<1"],
        "mlflow": ["mlflow-skinny>=3.17,<4", "sqlalchemy>=2.0,<3", "alembic>=1.13,<2"],
        # CometLogger (comet_ml.start and ExperimentConfig came in 3.44.4, the floor Lightning asks too)
        "comet": ["comet_ml>=3.44.4,<4"],
        "onnx": ["onnx>=1.16,<2", "onnxscript>=0.2,<1"],  # TaskModule.to_onnx: torch's exporter imports both
        # TaskCLI (tasktrain.cli): config files and command-line arguments from the classes' signatures
        "cli": ["jsonargparse>=4.53,<5"],
        # torchmetrics Metric objects given to self.log (imported only when one is logged)
        "torchmetrics": ["torchmetrics>=1.9,<2"],
        # streaming data (docs/data.md): Hugging Face datasets' shards as a ShardedSource; torchdata's
        # StatefulDataLoader as the training loader (and Accelerate's use_stateful_dataloader)
        "datasets": ["datasets>=5.2,<6"],
        "torchdata": ["torchdata>=0.11,<1"],
        # schedule-free optimizers (Accelerate's is_schedulefree_available and its schedule_free example)
        "schedulefree": ["schedulefree>=1.4,<2"],
        # RichProgressBar / RichModelSummary, and with rich installed the Trainer's defaults (Lightning's rule)
        "rich": ["rich>=15.0,<16"],
    },
    entry_points={"console_scripts": ["tasktrain=tasktrain.cli.main:main"]},
)
