"""The bookie server: trio application, request handling, supervisor, background services.

``appliance.core`` (the bookie's rules) is pure and imports without trio; the names
below are imported on first use (PEP 562) so that it stays so.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ledgerd.appliance.config import BookieConfig

__all__ = ["BookieConfig"]


def __getattr__(name: str) -> Any:
    if name == "BookieConfig":
        return importlib.import_module("ledgerd.appliance.config").BookieConfig
    raise AttributeError(f"module 'appliance' has no attribute {name!r}")
