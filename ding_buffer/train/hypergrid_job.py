"""``ding-buffer train`` for ``main_config['job'] = 'hypergrid'``: the local job (``hypergrid``), or the distributed
one (``hypergrid_dist``) when the buffer section has ``distributed.backend``.

This module sits above both: the distributed job builds on the local one's trainer, so neither imports the other
to dispatch.
"""

import argparse
import os

from .config import check_new_run_dir, run_dir_of
from .env import LAUNCHED
from .hypergrid import config_from_args, run_local
from .hypergrid_dist import run_distributed


def run(user: dict, args: argparse.Namespace) -> int:
    """Build the config, then train in this process or over the distributed buffer; returns the exit status."""
    cfg = config_from_args(user, args)
    bcfg = cfg.policy.other.replay_buffer
    if bcfg is not None and (bcfg.get('distributed') or {}).get('backend'):
        if args.resume is None and os.environ.get(LAUNCHED) != '1':  # the launcher checked it for its ranks
            check_new_run_dir(run_dir_of(cfg), cfg.log_dir)
        return run_distributed(cfg, args)
    return run_local(cfg, args)


__all__ = ['run']
