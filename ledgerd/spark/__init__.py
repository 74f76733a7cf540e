"""PySpark data sources for ledgers and logs (this package imports pyspark; ``import
ledgerd`` does not import it).

::

    import ledgerd.spark
    ledgerd.spark.register(spark)          # once per SparkSession
    spark.read.format("ledgerd").option("zk", zk).option("log", "events").load()

The worker Python must be the driver's (``PYSPARK_PYTHON``), with ledgerd installed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the ``ledgerd`` format (batch, streaming, writer) with ``spark``."""
    from ledgerd.spark.source import LedgerdDataSource

    spark.dataSource.register(LedgerdDataSource)
