"""`fastsgd/__init__.py`: the names it exports on first use."""

import ast
import importlib
from pathlib import Path

import fastsgd


def test_every_exported_name_resolves_to_the_object_of_its_module():
    for name in fastsgd.__all__:
        value = getattr(fastsgd, name)
        where = fastsgd._WHERE.get(name)
        if where is not None:  # a module of the package or a name in one
            module = importlib.import_module(where)
            assert value is (module if where.endswith(f".{name}") else getattr(module, name))


def test_the_lazy_names_and_the_type_checkers_imports_agree():
    tree = ast.parse(Path(fastsgd.__file__).read_text())
    checked = {alias.asname or alias.name: node.module or f"fastsgd.{alias.name}"
               for block in tree.body if isinstance(block, ast.If)
               for node in block.body if isinstance(node, ast.ImportFrom)
               for alias in node.names}
    # `from fastsgd import data` names the module fastsgd.data
    checked = {name: f"fastsgd.{name}" if module == "fastsgd" else module
               for name, module in checked.items()}
    assert checked == fastsgd._WHERE
    assert set(fastsgd._WHERE) <= set(fastsgd.__all__)
