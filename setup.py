from setuptools import find_packages, setup

setup(
    name="tasktrain",
    version="0.1.0",
    description="A thin, honest PyTorch trainer: Trainer, Accelerator, launcher, DeepSpeed and device maps.",
    packages=find_packages(include=["tasktrain", "tasktrain.*"]),
    python_requires=">=3.10",
    # torch is pinned by the Makefile before this runs; a range here installs nothing more.
    install_requires=["torch>=2.1", "deepspeed>=0.14", "tqdm", "tensorboard", "pyyaml"],
    entry_points={"console_scripts": ["tasktrain=tasktrain.cli.main:main"]},
)
