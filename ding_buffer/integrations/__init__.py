"""Adapters for other frameworks' pipelines. Each module imports its framework when it is imported itself, so
``import ding_buffer`` never needs one: ``dingengine`` (DI-engine's serial and task pipelines)."""
