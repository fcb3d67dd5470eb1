"""Tensor storage with memmap_dir: data lives in files, not in the process's memory."""

import os

import numpy as np
import pytest
import torch

from ding_buffer import create_buffer


def _rss_bytes():
    with open('/proc/self/statm') as f:
        return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


@pytest.mark.skipif(not os.path.exists('/proc/self/statm'), reason='needs Linux /proc')
def test_image_buffer_larger_than_its_resident_memory(tmp_path):
    capacity, shape = 100_000, (4, 84, 84)  # 2.8 GB per image field, 5.6 GB in all
    cfg = dict(
        type='naive', replay_buffer_size=capacity, seed=0, storage=dict(type='tensor', memmap_dir=str(tmp_path / 'mm'))
    )
    buffer = create_buffer(cfg)
    before = _rss_bytes()
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, size=(256, *shape), dtype=np.uint8)
    for k in range(4):
        buffer.extend({'obs': frames, 'next_obs': frames, 'action': np.arange(256) + 256 * k})
    files = sorted(os.listdir(tmp_path / 'mm'))
    assert len(files) == 3
    apparent = sum(os.path.getsize(tmp_path / 'mm' / f) for f in files)
    assert apparent >= 2 * capacity * int(np.prod(shape))  # the full-size fields exist on disk ...
    assert _rss_bytes() - before < 600 * 2**20  # ... but only touched pages are resident
    batch = buffer.sample(64)
    assert batch['obs'].dtype == torch.uint8 and batch['obs'].shape == (64, *shape)
    rows = batch['action'].numpy() % 256
    assert np.array_equal(batch['obs'].numpy(), frames[rows])
    # a save/load round trip works for memmap storage too
    buffer.save_data(str(tmp_path / 'buf.pt'))
    other = create_buffer({**cfg, 'storage': dict(type='tensor', memmap_dir=str(tmp_path / 'mm2'))})
    other.load_data(str(tmp_path / 'buf.pt'))
    assert other.count() == 1024
    slots = batch['replay_buffer_idx'].numpy()
    assert torch.equal(other.storage.gather(slots)['obs'], batch['obs'])
