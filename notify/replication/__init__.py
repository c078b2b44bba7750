"""Master/slave replication: asynchronous slaves that pull, synchronous slaves that the
master pushes to before acknowledging, and failover by promotion."""
