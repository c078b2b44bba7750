"""The on-disk message store: segment files, partitions, flush policy, recovery."""
