"""Hyper-parameter files, as Lightning's `lightning.pytorch.core.saving` helpers read and write them (its path under
the rename rule, `tasktrain.core.saving`, is tasktrain/compat/lightning/core/saving.py, which re-exports these; the
core reads them too: TaskModule.load_from_checkpoint's hparams_file): hparams.yaml (what the loggers write,
docs/logging.md) and the legacy meta_tags.csv.

As Lightning's: a missing file is a RuntimeWarning and {}; saving into a folder that does not exist is a RuntimeError;
a value YAML cannot hold is left out, with a warning (Lightning also overwrites it in the caller's dict with its type's
name; the dict given is left alone here). With `use_omegaconf=True` and omegaconf
installed, the YAML goes through OmegaConf (a DictConfig comes back), as Lightning does; without it, plain dicts."""
import ast
import csv
import importlib.util
import os
import warnings
from argparse import Namespace
from enum import Enum


def load_hparams_from_yaml(config_yaml, use_omegaconf=True):
    if not os.path.exists(config_yaml):
        warnings.warn(f"Missing Tags: {config_yaml}.", RuntimeWarning)
        return {}
    import yaml

    with open(config_yaml) as f:
        try:  # a file a user hands us: plain YAML only, no constructor that runs code (Lightning's full_load has some)
            hparams = yaml.load(f, Loader=_hparams_loader())
        except yaml.YAMLError as err:
            raise ValueError(f"{config_yaml} is not an hparams file tasktrain reads: plain YAML values (and the "
                             f"tuples yaml.dump writes) only. {err}") from None
    if use_omegaconf and importlib.util.find_spec("omegaconf") is not None:
        from omegaconf import OmegaConf
        from omegaconf.errors import UnsupportedValueType, ValidationError

        try:
            return OmegaConf.create(hparams)
        except (UnsupportedValueType, ValidationError):
            pass
    return hparams


def _hparams_loader():
    """yaml's SafeLoader plus the one Python tag the savers write for plain values: !!python/tuple."""
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_constructor("tag:yaml.org,2002:python/tuple", lambda loader, node: tuple(loader.construct_sequence(node)))
    return Loader


def save_hparams_to_yaml(config_yaml, hparams, use_omegaconf=True):
    _check_folder(config_yaml)
    import yaml

    if isinstance(hparams, Namespace):
        hparams = vars(hparams)
    elif isinstance(hparams, dict) and type(hparams) is not dict:  # (an AttributeDict: its items)
        hparams = dict(hparams)
    if use_omegaconf and importlib.util.find_spec("omegaconf") is not None:
        from omegaconf import OmegaConf
        from omegaconf.errors import UnsupportedValueType, ValidationError

        try:
            with open(config_yaml, "w", encoding="utf-8") as f:
                OmegaConf.save(OmegaConf.create(hparams), f)
            return
        except (UnsupportedValueType, ValidationError):
            pass
    if not isinstance(hparams, dict):
        raise TypeError("hparams must be dictionary")
    kept = {}
    for key, value in hparams.items():
        value = value.name if isinstance(value, Enum) else value
        try:
            yaml.dump(value)
        except (TypeError, ValueError):
            warnings.warn(f"Skipping '{key}' parameter because it is not possible to safely dump to YAML.")
            continue
        kept[key] = value
    with open(config_yaml, "w", newline="") as f:
        yaml.dump(kept, f)


def load_hparams_from_tags_csv(tags_csv):
    if not os.path.exists(tags_csv):
        warnings.warn(f"Missing Tags: {tags_csv}.", RuntimeWarning)
        return {}
    with open(tags_csv, newline="") as f:
        rows = list(csv.reader(f, delimiter=","))
    return {row[0]: _literal(row[1]) for row in rows[1:]}  # (the first row is the header)


def save_hparams_to_tags_csv(tags_csv, hparams):
    _check_folder(tags_csv)
    if isinstance(hparams, Namespace):
        hparams = vars(hparams)
    with open(tags_csv, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["key", "value"])
        for key, value in hparams.items():
            writer.writerow([key, value])


def _literal(text):
    """A value as written by str(): the number, bool, list, ... it was, else the text itself."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _check_folder(path):
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise RuntimeError(f"Missing folder: {folder}.")
