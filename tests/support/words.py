"""Cases of the routing-key word rule, shared by its two paths' tests."""

from __future__ import annotations

# (prefix, routing key, within): the word rule, which the store's SQL must agree with
# (tests/unit/test_keys.py and tests/integration/test_store_namespaces.py).
WITHIN_CASES = [
    ("billing.", "billing.invoice", True),
    ("billing", "billing.invoice", True),
    ("billing", "billing", True),
    ("billing.", "billing", True),
    ("billing", "billingx.invoice", False),
    ("billing.", "billingx", False),
    ("billing.inv", "billing.invoice", False),
    ("billing.inv", "billing.inv.x", True),
    ("a_b", "axb.c", False),  # no pattern characters: '_' is itself
    ("a%", "a%.b", True),
    ("audit:trail", "audit:trail.x", True),
    ("audit:", "audit:trail", False),
]
