"""Code shared by every jobq service: wire contracts, bounds, settings, errors and ids.

Nothing in here imports a service package; the import-linter contract in pyproject.toml checks it.
"""
