"""The ground floor: options and their checks, import paths, units, TOML files, and the run's
schema (schema.py). Imports nothing of fastsgd but errors.py."""

VERSION = "0.1.0"
