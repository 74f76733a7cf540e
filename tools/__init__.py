"""The `ledgerd` command line: bookie, local cluster, shell, inspection, benchmarks."""
