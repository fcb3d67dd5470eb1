"""TensorBoard writer of a buffer: borrowed when passed in, else optionally owned under DI-engine's path."""

import logging
import os
from typing import Any, List, Optional, Tuple

# What a monitor computed under the buffer's lock and the buffer writes after releasing it:
# (a log message or None, [(tag, value, step), ...]).
Due = Optional[Tuple[Optional[str], List[Tuple[str, float, int]]]]


def emit(due: Due, logger: Optional[logging.Logger], tb: Any) -> None:
    """Write a monitor's due output: call it *outside* the buffer's lock (TensorBoard writes are I/O)."""
    if not due:
        return
    text, scalars = due
    if text and logger is not None:
        logger.info(text)
    if tb is not None:
        for tag, value, step in scalars:
            tb.add_scalar(tag, value, step)


def rank() -> int:
    """torch.distributed rank, 0 when not initialised (only rank 0 writes TensorBoard, as in DI-engine)."""
    try:
        import torch.distributed as dist

        return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
    except Exception:
        return 0


def build_tb_logger(tb_logger: Any, enabled: bool, exp_name: str, instance_name: str) -> Tuple[Optional[Any], bool]:
    """
    Overview:
        ``(writer, owned)``. A passed-in writer is used as is and never closed by the buffer; otherwise, when
        ``enabled`` and on rank 0, a ``SummaryWriter`` at ``./{exp_name}/log/{instance_name}/{instance_name}_tb_logger``
        that the buffer closes.
    """
    if tb_logger is not None:
        return tb_logger, False
    if not enabled or rank() != 0:
        return None, False
    from torch.utils.tensorboard import SummaryWriter

    path = os.path.join('.', exp_name, 'log', instance_name, f'{instance_name}_tb_logger')
    return SummaryWriter(path), True
