"""Every ready config in config/ builds its buffer and works for a push/sample round."""

import importlib.util
import pathlib

import pytest
import torch
from helpers import assert_same

from ding_buffer import create_buffer

CONFIG_DIR = pathlib.Path(__file__).resolve().parent.parent / 'config'


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main_config


@pytest.mark.parametrize('path', sorted(CONFIG_DIR.glob('*_buffer_config.py')), ids=lambda p: p.stem)
def test_ready_config_builds_a_working_buffer(path):
    cfg = _load(path)
    buffer = create_buffer(cfg['policy']['other']['replay_buffer'], exp_name=cfg['exp_name'])
    kind = cfg['policy']['other']['replay_buffer']['type']
    if kind in ('gfn', 'gfn_diverse', 'terminating_state'):
        states = torch.randint(0, 4, (300, 3)).float()  # 64 distinct states: duplicates on purpose
        log_reward = torch.linspace(-3, 0, 300)
        assert buffer.push({'state': states, 'log_reward': log_reward, 'actions': torch.zeros(300, 5)}) == 300
        batch = buffer.sample(256)
        assert batch['state'].shape == (256, 3) and ('actions' in batch) == (kind != 'terminating_state')
        stats = buffer.stats()
        assert stats['size'] == 300 and stats['unique_terminating_states'] == len(torch.unique(states, dim=0))
    elif cfg['policy']['other']['replay_buffer'].get('sampler', {}).get('type') == 'prioritized':
        t = cfg['policy']['other']['replay_buffer']['sampler']['unroll_len']
        buffer.push([{'obs': torch.randn(t + 20, 4), 'reward': torch.ones(t + 20)} for _ in range(3)])
        batch = buffer.sample(16)
        assert batch['obs'].shape == (16, t, 4) and batch['mask'].all() and (batch['IS'] == 1).all()
        result = buffer.update(
            {
                'replay_unique_id': batch['replay_unique_id'],
                'replay_buffer_idx': batch['replay_buffer_idx'],
                'priority': torch.rand(16),
            }
        )
        assert result == {'updated': 16, 'stale': 0}
    elif cfg['policy']['other']['replay_buffer']['type'] == 'episode':
        buffer.push({'obs': torch.randn(50, 4), 'reward': torch.ones(50)})
        batch = buffer.sample(4, unroll_len=10, replace=True)
        assert batch['obs'].shape == (4, 10, 4) and batch['mask'].all()
    else:
        buffer.extend({'obs': torch.randn(300, 4), 'action': torch.zeros(300, dtype=torch.long)})
        batch = buffer.sample(256)
        assert batch['obs'].shape == (256, 4)
        if cfg['policy']['other']['replay_buffer']['type'] == 'advanced':  # prioritized: with replacement
            assert (batch['IS'] == 1).all()  # equal priorities
            result = buffer.update(
                {**{k: batch[k] for k in ('replay_unique_id', 'replay_buffer_idx')}, 'priority': torch.rand(256)}
            )
            assert result['updated'] + result['stale'] == 256 and result['stale'] == 0
        else:
            assert len(set(batch['replay_unique_id'].tolist())) == 256
            max_use = cfg['policy']['other']['replay_buffer'].get('max_use', float('inf'))
            if max_use != float('inf'):  # every item leaves after max_use draws: sampling runs dry
                draws = 256
                while buffer.sample(256) is not None and draws < 100 * 256:
                    draws += 256
                removed = buffer.stats()['removed_by_use']
                assert buffer.count() < 256 and removed == 300 - buffer.count() and draws <= 300 * max_use
    buffer.close()


@pytest.mark.parametrize('path', sorted(CONFIG_DIR.glob('*_distributed_config.py')), ids=lambda p: p.stem)
def test_ready_distributed_config_is_valid_and_runs_locally_without_its_section(path):
    from ding_buffer.distributed import build_distributed_config

    cfg = _load(path)['policy']['other']['replay_buffer']
    dcfg = build_distributed_config(cfg['distributed'])
    assert dcfg.backend in ('torch', 'mpi', 'ray')
    local = {k: v for k, v in cfg.items() if k != 'distributed'}
    local['replay_buffer_size'] = 1000
    buffer = create_buffer(local)
    buffer.extend({'obs': torch.randn(300, 4)})
    assert buffer.sample(256)['obs'].shape == (256, 4)


def test_advanced_ready_config_lists_every_key_the_readme_says_it_does():
    """README: `config/advanced_buffer_config.py` lists every key of the `advanced` buffer (cfg_type, the class
    tag default_config() adds, is not a knob)."""
    from ding_buffer import get_buffer_cls

    cfg = _load(CONFIG_DIR / 'advanced_buffer_config.py')['policy']['other']['replay_buffer']

    def keys(d, prefix=''):
        out = set()
        for k, v in d.items():
            out.add(prefix + k)
            if isinstance(v, dict):
                out |= keys(v, prefix + k + '.')
        return out

    defaults = get_buffer_cls({'type': 'advanced'}).default_config()
    assert keys(defaults) - {'cfg_type'} == keys(cfg)


def test_numpy_numbers_in_a_config_become_python_numbers_so_files_load_without_pickle(tmp_path):
    import numpy as np

    cases = [
        (dict(type='advanced', beta=np.float64(0.5), storage=dict(type='tensor')), {'obs': torch.zeros(2)}),
        (
            dict(type='gfn_diverse', cutoff_distance=np.float64(0.1), p_norm_distance=np.float64(2.0)),
            dict(state=torch.rand(4, 2), log_reward=torch.rand(4)),
        ),
    ]
    for cfg, data in cases:
        buf = create_buffer(cfg)
        assert all(not isinstance(v, np.generic) for v in buf.cfg.values())
        buf.push(data if cfg['type'] == 'gfn_diverse' else [data] * 4)
        buf.sample(2)
        path = str(tmp_path / f"{cfg['type']}.pt")
        buf.save_data(path)
        create_buffer(cfg).load_data(path)  # no allow_pickle: the state holds no numpy scalar
        assert isinstance(cfg.get('beta', cfg.get('cutoff_distance')), np.float64)  # the caller's config is untouched


@pytest.mark.parametrize('type_', ['naive', 'advanced', 'deque', 'elastic', 'sequence', 'episode', 'gfn'])
def test_a_capacity_whose_slots_exceed_memory_is_refused_naming_the_key(type_, monkeypatch):
    """Within 2**40 but beyond this machine's memory (made 1 MiB here): a ValueError naming replay_buffer_size at
    build, not numpy's MemoryError from allocating the slots."""
    import ding_buffer.config

    monkeypatch.setattr(ding_buffer.config, 'machine_memory', lambda: 1 << 20)
    with pytest.raises(ValueError, match=r"'replay_buffer_size'.*(fit in this machine's memory|GiB for its slots)"):
        create_buffer(dict(type=type_, replay_buffer_size=1 << 20))
    create_buffer(dict(type=type_, replay_buffer_size=1 << 10)).close()  # what fits is built


def test_the_memory_a_capacity_needs_is_its_storages(monkeypatch, tmp_path):
    """Each storage counts what it keeps per slot: list storage a reference and a collect_iter besides the ring's
    flag, tensor storage (in memory or memory-mapped) only the flag (its fields are checked as they are allocated),
    prioritized tables their trees too."""
    import ding_buffer.config

    monkeypatch.setattr(ding_buffer.config, 'machine_memory', lambda: 1 << 20)
    n = 1 << 17  # 128 KiB of flags; 2.1 MiB as list storage, 3.3 MiB with priority trees
    for storage in (dict(type='tensor'), dict(type='tensor', memmap_dir=str(tmp_path))):
        buf = create_buffer(dict(type='naive', replay_buffer_size=n, storage=storage))
        buf.push({'obs': torch.zeros(1)})
        assert buf.count() == 1
        buf.close()
    for cfg in (dict(type='naive', storage=dict(type='list')), dict(type='advanced', storage=dict(type='tensor'))):
        with pytest.raises(ValueError, match=f"config key 'replay_buffer_size' {n} needs"):
            create_buffer(dict(cfg, replay_buffer_size=n))


def test_a_frame_ring_too_large_for_memory_names_the_spare_rows():
    buf = create_buffer(
        dict(type='naive', replay_buffer_size=16, storage=dict(type='tensor', frames=dict(spare=2**40)))
    )
    step = dict(obs=torch.zeros(4, 2, 2, dtype=torch.uint8), next_obs=torch.zeros(4, 2, 2, dtype=torch.uint8),
                reward=1.0, done=False)  # fmt: skip
    before = buf.state_dict()
    with pytest.raises(ValueError, match=r"storage\.frames\.spare 1099511627776"):
        buf.push(step)
    assert_same(buf.state_dict(), before, 'state after the refused push')
    buf.close()


@pytest.mark.parametrize('key, expected', [('max_chunks', r'\[1, 2\*\*62\)'), ('max_reuse', r'\[1, 2\*\*62\)'),
                                           ('max_staleness', r'\[0, 2\*\*62\)')])  # fmt: skip
def test_chunk_int_keys_name_their_upper_bound(key, expected):
    with pytest.raises(ValueError, match=f"'{key}'.*expected .*{expected}"):
        create_buffer(dict(type='chunk', **{key: 2**62}))
