"""Control parts of a buffer: priorities and use counts, the push/sample rate limiter."""

from .priority import PriorityIndex
from .thruput import SampleTimeoutError, ThruputController

__all__ = ['PriorityIndex', 'ThruputController', 'SampleTimeoutError']
