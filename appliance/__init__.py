"""The bookie server: trio application, request handling, supervisor, background services."""

from appliance.config import BookieConfig

__all__ = ["BookieConfig"]
