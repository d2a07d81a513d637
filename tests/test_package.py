"""`fastsgd/__init__.py`: the names it exports on first use."""

import ast
import importlib
import importlib.util
from pathlib import Path

import fastsgd


def test_every_exported_name_resolves_to_the_object_of_its_module():
    for name in fastsgd.__all__:
        value = getattr(fastsgd, name)
        where = fastsgd._WHERE.get(name)
        if where is not None:  # a module of the package or a name in one
            module = importlib.import_module(where)
            assert value is (module if where.endswith(f".{name}") else getattr(module, name))


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name inside a module, not a module of the package
        return False


def test_the_lazy_names_and_the_type_checkers_imports_agree():
    tree = ast.parse(Path(fastsgd.__file__).read_text())
    checked = {alias.asname or alias.name: node.module or f"fastsgd.{alias.name}"
               for block in tree.body if isinstance(block, ast.If)
               for node in block.body if isinstance(node, ast.ImportFrom)
               for alias in node.names}
    # `from fastsgd.workloads import data` names the module fastsgd.workloads.data
    checked = {name: f"{module}.{name}" if _is_module(f"{module}.{name}") else module
               for name, module in checked.items()}
    assert checked == fastsgd._WHERE
    assert set(fastsgd._WHERE) <= set(fastsgd.__all__)
