"""Config names mapped to the objects that define them, and what each declares, read from its source.

A `Registry` maps a config name (dataset=..., model=...) to a ``"module:attribute"`` path and imports it on
first access. `Registry.declared` reads what an entry declares (its OPTIONS, its SPEC, a model family's
INPUTS) from the module's source with `ast`, without running it, so the config check (experiments/schema.py)
learns every dataset's and model's names and keys from the one place they are written, before TensorFlow starts.
"""
import ast
import gc
import importlib
import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path


@dataclass(frozen=True)
class Call:
    """A call as its source reads, e.g. ``DatasetSpec(name="toy", channels=1)``: `function` is the full name
    of a class the source defines or imports (``tf_harness.data.spec.DatasetSpec``), else as written;
    arguments that are not literals (or names of literals) read as UNREADABLE."""

    function: str
    args: tuple
    kwargs: dict

    def __repr__(self):
        return f"{self.function}(...)"


UNREADABLE = type("Unreadable", (), {"__repr__": lambda self: "nothing readable"})()


class Registry(Mapping):
    """Config names to the objects that ``"module:attribute"`` paths name, each imported on first access.

    Iterating the names, or reading what an entry declares (`declared`), imports nothing.
    """

    def __init__(self, paths: dict):
        self.paths = dict(paths)
        self._objects = {}

    def __getitem__(self, name):
        path = self.paths[name]
        if self._objects.get(name, (None,))[0] != path:
            module, _, attribute = path.partition(":")
            self._objects[name] = path, getattr(importlib.import_module(module), attribute)
        return self._objects[name][1]

    def __contains__(self, name):
        return name in self.paths

    def __iter__(self):
        return iter(self.paths)

    def __len__(self):
        return len(self.paths)

    def read(self, name, attribute, accepts, wanted):
        """What entry `name` declares as `attribute` (see `declared`); a LookupError, saying to write it as
        `wanted`, where `accepts` refuses it."""
        value = self.declared(name, attribute).get(attribute, UNREADABLE)
        if not accepts(value):
            raise LookupError(f"{self.paths[name]}: the config check reads {attribute} from the source, before "
                              f"TensorFlow starts, and finds {value!r} there; write it as {wanted}")
        return value

    def options(self, name) -> tuple:
        """The OPTIONS that entry `name` declares: the config keys it reads from its group (dataset.*, model.*)."""
        return tuple(self.read(name, "OPTIONS", lambda value: isinstance(value, (tuple, list)) and all(
            isinstance(option, str) for option in value), 'a tuple of key names, e.g. ("fold",)'))

    def declared(self, name, *attributes) -> dict:
        """{attribute: value} for those of `attributes` that entry `name` declares, read from its module's
        source without running it: a class's attributes (its bases' included), or a function's module's
        top-level names. A value is a literal, a `Call`, or UNREADABLE where the source computes it."""
        module, _, attribute = self.paths[name].partition(":")
        names = _module_names(module, import_parents=True)
        found = _resolved(names.get(attribute, UNREADABLE))
        if isinstance(found, _Class):
            names = _class_attributes(found)
        elif found is UNREADABLE:
            raise LookupError(f"{_source(module)} defines no {attribute}, which {self.paths[name]} names")
        return {key: _resolved(names[key]) for key in attributes if key in names}


# Reading source without running it -----------------------------------------------------------------

@dataclass(frozen=True)
class _Class:
    module: str
    node: ast.ClassDef


@dataclass(frozen=True)
class _Imported:
    module: str
    name: str


_FUNCTION = type("Function", (), {"__repr__": lambda self: "a function"})()


def _source(module, import_parents=False) -> str:
    """The file of `module`, found without running it. Its parent packages must be imported already, unless
    `import_parents`: following another module's imports never imports anything (TensorFlow included)."""
    parent = module.rpartition(".")[0]
    if parent and parent not in sys.modules:
        if not import_parents:
            raise LookupError(f"{parent} is not imported")
        importlib.import_module(parent)
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise LookupError(f"no Python source for {module}")
    return spec.origin


def _module_names(module, import_parents=False) -> dict:
    """The top-level names of `module`'s source: constants, classes and names imported from other modules."""
    path = _source(module, import_parents)
    return _names_in(module, path, Path(path).stat().st_mtime_ns)


@lru_cache(maxsize=None)
def _names_in(module, path, mtime_ns) -> dict:
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    names = {}
    collecting = gc.isenabled()
    gc.disable()  # a syntax tree has no cycles; its many nodes would set off a full collection of the process
    try:
        tree = ast.parse(Path(path).read_text(), path)
    finally:
        if collecting:
            gc.enable()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            source = importlib.util.resolve_name("." * node.level + (node.module or ""), package)
            names.update({alias.asname or alias.name: _Imported(source, alias.name) for alias in node.names})
        elif isinstance(node, ast.ClassDef):
            names[node.name] = _Class(module, node)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names[node.name] = _FUNCTION
        else:
            names.update(_assigned(node, names))
    return names


def _assigned(node, names) -> dict:
    """{name: value} for an assignment to one name (``x = ...`` or ``x: type = ...``), else {}."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return {node.targets[0].id: _value(node.value, names)}
    if isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
        return {node.target.id: _value(node.value, names)}
    return {}


def _value(node, names):
    """What expression `node` evaluates to, as far as reading it tells; names imported from elsewhere stay
    unresolved (`_resolved` follows them)."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if isinstance(node, ast.Name):
        return names.get(node.id, UNREADABLE)
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_value(item, names) for item in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
        function = names.get(node.func.id, node.func.id) if isinstance(node.func, ast.Name) else ast.unparse(node.func)
        return Call(function, tuple(_value(arg, names) for arg in node.args),
                    {keyword.arg: _value(keyword.value, names) for keyword in node.keywords if keyword.arg})
    return UNREADABLE


def _resolved(value, depth=0):
    """`value`, each name imported from another module in it replaced by what that module's source assigns."""
    if depth > 20:
        return UNREADABLE
    if isinstance(value, _Imported):
        try:
            return _resolved(_module_names(value.module).get(value.name, UNREADABLE), depth + 1)
        except (LookupError, ImportError, SyntaxError, OSError, ValueError):
            return UNREADABLE
    if isinstance(value, (tuple, list)):
        return type(value)(_resolved(item, depth + 1) for item in value)
    if isinstance(value, Call):
        function = _resolved(value.function, depth + 1)
        function = f"{function.module}.{function.node.name}" if isinstance(function, _Class) else str(function)
        return Call(function, _resolved(value.args, depth + 1),
                    {key: _resolved(item, depth + 1) for key, item in value.kwargs.items()})
    return value


def _class_attributes(found: _Class) -> dict:
    """The class attributes a class body assigns, over those of its bases (the first base wins)."""
    names = _module_names(found.module)
    attributes = {}
    for base in reversed(found.node.bases):
        base_class = _resolved(_value(base, names))
        if isinstance(base_class, _Class):
            attributes.update(_class_attributes(base_class))
    own = {}
    for node in found.node.body:
        own.update(_assigned(node, {**names, **own}))
    return {**attributes, **own}
