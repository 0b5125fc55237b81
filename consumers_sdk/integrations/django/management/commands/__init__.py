"""``run_consumer``: one module a command, as Django looks them up."""
