"""Bulk actions: what one changes and the checks a request passes (pure), the share of the
database their reads may take (pure), and the runner that works them."""
