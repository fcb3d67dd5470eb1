"""Small helpers shared by the package (re-exported for DI-engine compatibility)."""
from .config import deep_merge_dicts

__all__ = ['deep_merge_dicts']
