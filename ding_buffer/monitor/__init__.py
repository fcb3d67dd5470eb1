"""Monitoring: sampled-data and throughput monitors writing DI-engine's TensorBoard tags, the used-data remover."""

from .periodic import PeriodicThruputMonitor
from .sampled_data import SampledDataAttrMonitor
from .used_data_remover import UsedDataRemover

__all__ = ['UsedDataRemover', 'SampledDataAttrMonitor', 'PeriodicThruputMonitor']
