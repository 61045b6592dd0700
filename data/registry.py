"""Config names mapped to the objects that define them, and what each declares, in one line per name.

A `Registry` maps a config name (dataset=..., model=...) to an `Entry`: the ``"module:attribute"`` path of
its object, imported on first access, and what the config check (experiments/config/schema.py) needs before
TensorFlow starts: what an example is (`inputs`) and the config keys the object reads (`options`). The
entry is where those are written: a Task class takes its own from it (`Registry.declaring`), and a model
family's module imports its entry.
"""
import importlib
from collections.abc import Mapping
from dataclasses import dataclass

# What an example is: one image, or a pair of them.
INPUTS = ("single", "pair")


@dataclass(frozen=True)
class Entry:
    """One registry line: the object's ``"module:attribute"`` path, ``single`` or ``pair`` (`inputs`), and the
    keys of its config group that it reads besides the ones every entry has (`options`)."""

    path: str
    inputs: str
    options: tuple = ()

    def __post_init__(self):
        module, colon, attribute = self.path.partition(":")
        if not (module and colon and attribute):
            raise ValueError(f"{self.path!r} is not a 'module:attribute' path")
        if self.inputs not in INPUTS:
            raise ValueError(f"{self.path}: inputs={self.inputs!r} is not one of {'|'.join(INPUTS)}")
        if not isinstance(self.options, tuple) or not all(isinstance(option, str) for option in self.options):
            raise ValueError(f"{self.path}: options={self.options!r} is not a tuple of key names, e.g. ('fold',)")

    @property
    def paired(self) -> bool:
        return self.inputs == "pair"


class Registry(Mapping):
    """Config names to the objects their entries name, each imported on first access.

    Iterating the names, or reading an entry (`entries`), imports nothing.
    """

    def __init__(self, entries: dict):
        self.entries = dict(entries)
        self._objects = {}

    @property
    def paths(self) -> dict:
        """{name: "module:attribute"}."""
        return {name: entry.path for name, entry in self.entries.items()}

    def __getitem__(self, name):
        path = self.entries[name].path
        if self._objects.get(name, (None,))[0] != path:
            module, _, attribute = path.partition(":")
            self._objects[name] = path, getattr(importlib.import_module(module), attribute)
        return self._objects[name][1]

    def __contains__(self, name):
        return name in self.entries

    def __iter__(self):
        return iter(self.entries)

    def __len__(self):
        return len(self.entries)

    def inputs(self, name) -> str:
        """``single`` or ``pair``, as entry `name` declares."""
        return self.entries[name].inputs

    def options(self, name) -> tuple:
        """The config keys entry `name` declares it reads from its group (dataset.*, model.*)."""
        return self.entries[name].options

    def declaring(self, module, attribute):
        """The entry whose path names `attribute` of `module`, or None."""
        return next((entry for entry in self.entries.values() if entry.path == f"{module}:{attribute}"), None)
