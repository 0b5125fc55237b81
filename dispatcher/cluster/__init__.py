"""Who owns which shards: one interface, single-node and ZooKeeper implementations."""
