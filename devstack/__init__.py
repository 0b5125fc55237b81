"""Throwaway PostgreSQL, RabbitMQ and ZooKeeper from system binaries, for tests and `make run`."""
