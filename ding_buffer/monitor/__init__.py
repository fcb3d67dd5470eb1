"""Monitoring helpers: the used-data remover (TensorBoard monitors build on ``stats()``)."""
from .used_data_remover import UsedDataRemover

__all__ = ['UsedDataRemover']
