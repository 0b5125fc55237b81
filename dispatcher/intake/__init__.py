"""Intake: new jobs validated, stored in shared commits and offered to the heap."""
