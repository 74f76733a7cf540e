"""PySpark data sources for ledgers and logs (imported only when used)."""
