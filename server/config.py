"""Server configuration (placeholder module header; full loader follows)."""

from providers.config_errors import ConfigError

__all__ = ["ConfigError"]
