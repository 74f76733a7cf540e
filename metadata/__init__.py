"""Cluster metadata: the MetadataStore protocol, ZooKeeper and in-memory stores, ledger metadata."""
