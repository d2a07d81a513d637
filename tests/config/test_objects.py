"""Import paths: what they resolve to, also from before a module moved."""

from fastsgd.config.objects import resolve
from fastsgd.workloads.models import build_model


def test_an_import_path_from_before_the_layer_folders_still_resolves():
    # config.toml files written before the move named fastsgd.models, fastsgd.data ...
    assert resolve("fastsgd.models:build_model", "model.name") is build_model
    assert resolve("fastsgd.workloads.models:build_model", "model.name") is build_model
