"""ledgerd: the Python client of the ledgerd replicated journal.

This is the one name applications import. ``ledgerd.spark`` (PySpark data sources) is
imported lazily, so the client works without pyspark installed.
"""

from ledgerd.config import ClientConfig, ConfigError

__all__ = ["ClientConfig", "ConfigError", "__version__"]

__version__ = "0.1.0"
