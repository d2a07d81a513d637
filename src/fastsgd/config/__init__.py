"""The ground floor: options and their checks, import paths, units, TOML files, the run's
keys (keys.py) and how a config is read, checked and written (schema.py). Imports nothing
of fastsgd but errors.py."""

VERSION = "0.1.0"
