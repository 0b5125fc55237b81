"""PostgreSQL's clock, as the timekeeper reads it."""

from typing import Final

# PostgreSQL's clock as it is read (not the transaction's start, which now() gives), in POSIX
# seconds: the node's time source (timekeeper.py).
READ_CLOCK: Final = "SELECT extract(epoch FROM clock_timestamp())::float8"
