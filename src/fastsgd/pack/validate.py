"""What a graph in a job archive may hold before torch.export loads it.

torch.export's loader trusts its input: it unpickles some members (weights and constants
saved with pickle, custom objects, example inputs), passes symbolic shapes to
`sympy.sympify` (which evaluates Python) and compiles the input guards as Python code. A
checksum does not help against an archive made to attack (anyone can recompute it), so
every graph is checked against what `fastsgd pack` itself writes:
- the inner members are exactly the known ones, the weight and constant tables empty, the
  example inputs empty: nothing there to unpickle;
- every operator is an ATen operator (or one of Python's `operator` module);
- every symbolic expression and every guard is made of shape symbols, sizes, numbers and
  arithmetic or comparisons, and nothing else a Python or sympy evaluation could call.
"""

from __future__ import annotations

import io
import json
import re
import zipfile
from typing import Any

MEMBERS = {"archive_format", "archive_version", ".data/version", "byteorder",
           ".data/serialization_id", "models/model.json", "data/weights/model_weights_config.json",
           "data/constants/model_constants_config.json", "data/sample_inputs/model.pt"}
EMPTY_TABLES = ("data/weights/model_weights_config.json",
                "data/constants/model_constants_config.json")
TARGET = re.compile(r"(torch\.ops\.aten\.\w+\.\w+|_operator\.\w+)")
# sympy's printing of shape symbols and the few functions shape arithmetic uses
SYMBOL = re.compile(r"Symbol\('[a-z]\d+'(, (positive|integer|nonnegative)=(True|False))*\)"
                    r"|\b(Mod|FloorDiv|CeilDiv|PythonMod|Max|Min|Integer|Mul|Add)\b|\b[a-z]\d+\b")
GUARD_SIZE = re.compile(r"L\['\w+'\]\.size\(\)\[\d+\]")
PLAIN = re.compile(r"[\d\s+\-*/%(),<>=!]*")


def check_program(data: bytes) -> str | None:
    """Why this saved program is not one `fastsgd pack` writes, or None."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as inner:
            infos = {i.filename: i for i in inner.infolist()}
            roots = {name.split("/", 1)[0] for name in infos}
            if len(roots) != 1:
                return f"unexpected layout ({sorted(infos)[:3]}...)"
            root = roots.pop()
            names = {name[len(root) + 1:] for name in infos}
            if names != MEMBERS:
                return f"unexpected members {sorted(names ^ MEMBERS)}"
            if infos[f"{root}/data/sample_inputs/model.pt"].file_size:
                return "pickled example inputs"
            for table in EMPTY_TABLES:
                if json.loads(inner.read(f"{root}/{table}")) != {"config": {}}:
                    return f"weights or constants saved apart ({table})"
            program = json.loads(inner.read(f"{root}/models/model.json"))
    except (zipfile.BadZipFile, ValueError, KeyError, OSError) as e:
        return f"damaged ({e})"
    return _check_strings(program)


def _check_strings(program: Any) -> str | None:
    for key, value in _items(program):
        if key == "target" and isinstance(value, str) and not TARGET.fullmatch(value):
            return f"operator {value!r} is not an ATen operator"
        if key == "expr_str" and not _plain(SYMBOL.sub("", str(value))):
            return f"symbolic expression {value!r} is not shape arithmetic"
        if key == "guards_code":
            for guard in value or []:
                if not _plain(GUARD_SIZE.sub("", str(guard)).replace("and", "")):
                    return f"input guard {guard!r} is not a comparison of sizes"
    return None


def _plain(text: str) -> bool:
    return PLAIN.fullmatch(text) is not None


def _items(node: Any) -> Any:
    """Every (key, value) pair of a JSON document, at any depth."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield key, value
            yield from _items(value)
    elif isinstance(node, list):
        for value in node:
            yield from _items(value)
