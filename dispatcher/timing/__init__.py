"""The node's time: PostgreSQL's clock, measured (timekeeper), and what it is read from."""
