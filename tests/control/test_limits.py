"""The removers (``ding_buffer.control.limits``): ``max_use`` and ``max_staleness`` against brute-force references
(a per-slot counter, a walk from the oldest element), the rules a config builds and the argument checks of
``build_remover`` (key, value, did-you-mean), the ``UseCounts`` column (bump order, undo, compaction, save /
restore with a bad state refused) and the base ``Remover`` (no slots)."""

from collections import Counter

import numpy as np
import pytest
import torch
from easydict import EasyDict

from ding_buffer.control.limits import (
    NO_ITER,
    REMOVER_REGISTRY,
    Remover,
    StalenessLimit,
    UseCounts,
    UseLimit,
    build_remover,
    build_removers,
)


class Table:
    """The read-only table a remover sees: elements at shuffled slots, oldest first."""

    def __init__(self, collect_iters, rng):
        self.slots = rng.permutation(len(collect_iters) * 2)[: len(collect_iters)]
        self.ci = dict(zip(self.slots.tolist(), collect_iters))

    def oldest(self, k):
        return self.slots[:k]

    def collect_iter(self, slots):
        return np.array([self.ci[s] for s in slots.tolist()], dtype=np.int64)

    def count(self):
        return len(self.slots)


@pytest.mark.parametrize('n', [0, 5, 64, 300])  # 300: the walk doubles its chunk past 64
@pytest.mark.parametrize('max_staleness', [1, 7, float('inf')])
def test_staleness_limit_matches_a_walk_from_the_oldest(n, max_staleness):
    rng = np.random.default_rng(n)
    for _ in range(20):
        ci = np.sort(rng.integers(0, 400, n)).tolist()  # collected in order...
        ci = [NO_ITER if rng.random() < 0.01 else c for c in ci]  # ...a few without collect_iter
        table, now = Table(ci, rng), int(rng.integers(0, 450))
        expected = []
        for slot, c in zip(table.slots.tolist(), ci):
            if c == NO_ITER or now - c < max_staleness:
                break
            expected.append(slot)
        assert StalenessLimit(max_staleness).before_sample(table, now).tolist() == expected
        assert StalenessLimit(max_staleness).after_sample(table, table.slots, None).tolist() == []


@pytest.mark.parametrize('max_use', [1, 2, 3])
def test_use_limit_with_use_counts_removes_an_element_at_its_max_use_th_draw(max_use):
    rng = np.random.default_rng(max_use)
    use, rule, drawn = UseCounts(16), UseLimit(max_use), Counter()
    live = set(range(16))
    for _ in range(50):
        slots = rng.choice(sorted(live), size=min(4, len(live)))  # with replacement: repeats in a batch
        counts = use.bump(slots)
        expected_counts = [drawn.update([s]) or drawn[s] for s in slots.tolist()]  # 1, 2, ... per repeat
        assert counts.tolist() == expected_counts
        gone = rule.after_sample(None, slots, counts)
        assert gone.tolist() == sorted({s for s in slots.tolist() if drawn[s] >= max_use})
        assert rule.before_sample(None, 0).tolist() == []
        live -= set(gone.tolist())
        use.reset(gone)
        if not live:
            break
    assert all(drawn[s] < max_use for s in live) and all(drawn[s] >= max_use for s in set(range(16)) - live)


def test_build_removers_from_the_config_keys_then_the_entries():
    rules = build_removers(EasyDict(max_use=2, max_staleness=5, removers=[dict(type='max_use', max_use=9)]))
    assert [(type(r), r.name) for r in rules] == [(StalenessLimit, 'staleness'), (UseLimit, 'use'), (UseLimit, 'use')]
    assert (rules[0].max_staleness, rules[1].max_use, rules[2].max_use) == (5, 2, 9)
    assert build_removers(EasyDict(max_use=float('inf'), max_staleness=float('inf'), removers=None)) == []


@pytest.mark.parametrize(
    'entry,match',
    [
        (dict(type='max_staleness', max_staleness=-5), r"'removers\[2\].max_staleness' has invalid value -5; expected"),
        (dict(type='max_use', max_use=True), r"'removers\[2\].max_use' has invalid value True"),
        (dict(type='max_use', max_use='3'), r"'removers\[2\].max_use' has invalid value '3'"),
        (
            dict(type='max_uses', max_use=3),
            r"'max_uses' \(config key 'removers\[2\].type'\); did you mean 'max_use'",
        ),
        (dict(type='zzzz'), r"type 'zzzz' \(config key 'removers\[2\].type'\); registered: .*max_staleness, max_use"),
        (dict(type='max_use', limit=3), r"'removers\[2\]' \('max_use'\) has bad arguments \{'limit': 3\}"),
        (dict(max_use=3), r"'removers\[2\]' must be a dict with a 'type'"),
        ('max_use', r"'removers\[2\]' must be a dict with a 'type', got 'max_use'"),
    ],
)
def test_build_remover_refuses_bad_entries_naming_the_key(entry, match):
    registry, before = dict(REMOVER_REGISTRY), repr(entry)
    with pytest.raises(ValueError, match=match):
        build_remover(entry, 'removers[2]')
    assert dict(REMOVER_REGISTRY) == registry and repr(entry) == before  # nothing changed
    if isinstance(entry, dict) and entry.get('type') == 'zzzz':
        with pytest.raises(ValueError) as e:
            build_remover(entry, 'removers[2]')
        assert 'did you mean' not in str(e.value)  # nothing close: no guess


def test_use_counts_undo_compact_and_save_restore():
    use = UseCounts(6)
    use.bump(np.array([0, 2, 2, 5, 5, 5]))
    use.unbump(np.array([5, 2]))  # a failed sample takes its draws back
    assert use[np.arange(6)].tolist() == [1, 0, 1, 0, 0, 2]
    use.compact(np.array([5, 0]))
    assert use[np.arange(6)].tolist() == [2, 1, 0, 0, 0, 0]
    use.resize(8)
    assert use[np.arange(8)].tolist() == [2, 1, 0, 0, 0, 0, 0, 0]
    placed = UseCounts.placed(8, np.array([0, 1]), np.array([2, 1]))
    assert placed[np.arange(8)].tolist() == use[np.arange(8)].tolist()
    valid = np.arange(8) < 2
    restored = use.restored(use.state_dict(), valid)
    assert restored[np.arange(8)].tolist() == [2, 1, 0, 0, 0, 0, 0, 0] and restored is not use
    for bad, match in [
        (np.zeros(7, np.int32), r"shape \(7,\)"),
        (np.zeros(8, np.float32), 'dtype float32'),
        (np.array([2, -1, 0, 0, 0, 0, 0, 0]), '>= 0'),
        (np.array([2, 1, 1, 0, 0, 0, 0, 0]), 'non-zero at empty slots'),
    ]:
        with pytest.raises(ValueError, match=match):
            use.restored(bad, valid)
    assert use[np.arange(8)].tolist() == [2, 1, 0, 0, 0, 0, 0, 0]


def test_base_remover_removes_nothing_and_checks_nothing():
    rule = Remover()
    assert (rule.name, dict(rule.checks)) == ('rule', {})
    for out in (rule.before_sample(None, 10**9), rule.after_sample(None, np.arange(5), np.full(5, 99))):
        assert out.dtype == np.int64 and out.shape == (0,)


def test_use_counts_count_past_int32_and_a_failed_sample_takes_its_draw_back():
    """Use counts were int32 per slot: a saved count of 2**31 - 1 was accepted, the next draw wrapped it to -2**31
    and the buffer's own state no longer loaded. They count on in int64 (a saved count past 2**62 is refused), and a
    sample that failed after its draw (here a deep copy that raises) puts each count back exactly."""
    from ding_buffer import create_buffer

    refuse = [False]

    class Uncopyable:
        def __deepcopy__(self, memo):
            if refuse[0]:
                raise RuntimeError('no copies')
            return Uncopyable()

    for storage in ('tensor', 'list'):
        cfg = dict(type='advanced', replay_buffer_size=4, seed=0, storage=dict(type=storage))
        buf = create_buffer(cfg)
        buf.push([{'obs': torch.zeros(2)} for _ in range(4)])
        state = buf.state_dict()
        state['index']['use'][:] = 2**31 - 1
        other = create_buffer(cfg)
        other.load_state_dict(state)
        out = other.sample(4)
        use = out['use'].tolist() if storage == 'tensor' else [item['use'] for item in out]
        assert min(use) >= 2**31, use  # counted on, past int32
        after = other.state_dict()
        assert (after['index']['use'] >= 2**31 - 1).all()
        create_buffer(cfg).load_state_dict(after)  # its own state loads back
        for bad in (-1, 2**62 + 1):
            state['index']['use'][:] = bad
            with pytest.raises(ValueError, match='use counts'):
                create_buffer(cfg).load_state_dict(state)
    cfg = dict(type='advanced', replay_buffer_size=4, seed=0, deepcopy=True)
    buf = create_buffer(cfg)
    buf.push([{'obs': Uncopyable()} for _ in range(4)])
    state = buf.state_dict()
    state['index']['use'][:] = 2**31 - 1
    buf.load_state_dict(state, deepcopy=False)
    before = buf.state_dict()['index']['use'].clone()
    refuse[0] = True
    with pytest.raises(RuntimeError, match='no copies'):
        buf.sample(3)
    refuse[0] = False
    assert buf.state_dict()['index']['use'].tolist() == before.tolist()
