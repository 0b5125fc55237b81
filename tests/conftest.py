"""Markers and cross-cutting fixtures only; the service fixtures live in tests/services."""

pytest_plugins = ["tests.services.fixtures"]
