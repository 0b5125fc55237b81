"""PostgreSQL access. Nothing above this package imports asyncpg."""
