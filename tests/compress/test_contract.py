"""The codec contract (compress/contract.py): each mistake in a codec class ends the job when
it starts, in one line naming the class (module:Class) and the mistake."""

import pytest
import torch

import fastsgd as fs
from fastsgd.compress import CODECS, check_codec_class
from fastsgd.config.objects import import_path
from fastsgd.config.options import Option
from fastsgd.errors import ConfigError

SMALL = {"data.name": "digits", "model.name": "mlp", "run.workers": 2, "run.steps": 2}
HERE = __name__


class NoKind:
    """A plain codec class without `kind`."""

    name, FIELDS = "no_kind", ["values"]

    def init(self, like):
        return {}

    def encode(self, tensor, state):
        return {"values": tensor}

    def compress(self, tensor):
        return {"values": tensor}

    def decode(self, payload, like):
        return payload["values"].view_as(like)

    def nbytes(self, payload):
        return 0


class Dense(fs.Identity):
    name, kind = "dense", "dense"


class NoName(fs.Identity):
    name = ""


class FieldsString(fs.Identity):
    name, FIELDS = "fields_string", "values"


class NoCompress(fs.Codec):  # compress left abstract
    name, kind, FIELDS = "no_compress", "exact", ["values"]

    def decode(self, payload, like):
        return payload["values"].view_as(like)


class Duck:
    """A plain codec class without decode."""

    name, kind, FIELDS = "duck", "exact", ["values"]

    def init(self, like):
        return {}

    def encode(self, tensor, state):
        return {"values": tensor}

    def compress(self, tensor):
        return {"values": tensor}

    def nbytes(self, payload):
        return 0


class Undeclared(fs.Identity):
    name = "undeclared"

    def __init__(self, bits: int = 4):
        self.bits = bits


class OptionNotOption(fs.Identity):
    name, OPTIONS = "option_not_option", {"bits": 4}

    def __init__(self, bits: int = 4):
        self.bits = bits


@pytest.mark.parametrize("cls, mistake", [
    (NoKind, "has no kind: give it a class attribute kind = \"...\", one of exact, quantize"),
    (Dense, "has kind = 'dense': it must be one of exact, quantize, sparse, lowrank"),
    (NoName, "has name = '': it must be a class attribute, a non-empty str"),
    (FieldsString, "has FIELDS = 'values': it must list the payload's tensors by name"),
    (NoCompress, "lacks compress(tensor), which fastsgd calls"),
    (Duck, "lacks decode(payload, like), which fastsgd calls"),
    (torch.nn.Linear, "has none of a codec's methods (init, encode, compress, decode, nbytes)"),
    (Undeclared, "takes 'bits' in __init__, which its OPTIONS do not declare"),
    (OptionNotOption, "has OPTIONS['bits'] = an int: it must be a fastsgd.Option"),
])
def test_a_broken_codec_class_named_in_the_config_is_one_line(cls, mistake, tmp_path):
    path = import_path(cls)  # torch.nn:Linear, or this module's
    with pytest.raises(ConfigError) as err:
        fs.Job(options={**SMALL, "compression.name": path, "run.out": str(tmp_path / "run")},
               quiet=True)
    assert str(err.value).startswith(f"codec class {path} {mistake}")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "run").exists()


def test_a_broken_codec_object_given_to_the_api_is_one_line():
    with pytest.raises(ConfigError, match=f"^codec class {HERE}:Dense has kind = 'dense'"):
        fs.Job(options=SMALL, compressor=Dense(), quiet=True)


def test_every_builtin_codec_keeps_the_contract():
    for name in CODECS:
        check_codec_class(CODECS.get(name))


def test_the_option_a_codec_declares_is_checked_with_the_class():
    class Fine(fs.Identity):
        name, OPTIONS = "fine", {"bits": Option(int, 4)}

        def __init__(self, bits: int = 4):
            self.bits = bits

    check_codec_class(Fine)
