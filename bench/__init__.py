"""Benchmarks: scripts that print figures. Never asserted in tests."""
