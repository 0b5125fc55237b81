"""The node's upkeep: housekeeping, its standing, and what holds vacuum back."""
