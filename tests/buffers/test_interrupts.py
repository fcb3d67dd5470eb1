"""A call stopped part-way by an asynchronous exception -- a Ctrl-C (``KeyboardInterrupt``), a watchdog's alarm --
leaves a buffer that later calls can use and save: no lock stays taken, and no item is counted that was not written
(a training script that catches the Ctrl-C and saves its buffer resumes from it).

The exception is raised where CPython runs signal handlers in the package's frames: as a function starts, or as a
call into C returns (the ``call`` and ``c_return`` events of ``sys.setprofile``; a Python function's return is not
such a point). Every such point of one call is tried in turn, on a fresh buffer each time.
"""

import os
import sys
import threading
from typing import Optional

import pytest
import torch

from ding_buffer import create_buffer

PACKAGE = os.path.dirname(sys.modules['ding_buffer'].__file__)
CAPACITY, STORED = 8, 6


def stop_at(call, point: int) -> Optional[str]:
    """Run ``call()``, raising ``KeyboardInterrupt`` at its ``point``-th signal point in the package: the name of the
    function it was raised in, or None when the call finished first (``point`` is past its last one). (One raised
    where Python ignores it -- a generator being closed -- lets the call go on.)"""
    seen, where = 0, None

    def profile(frame, event, arg):
        nonlocal seen, where
        if event in ('call', 'c_return') and frame.f_code.co_filename.startswith(PACKAGE):
            seen += 1
            if seen == point:
                where = frame.f_code.co_name
                raise KeyboardInterrupt

    sys.setprofile(profile)
    try:
        call()
    except KeyboardInterrupt:
        pass
    finally:
        sys.setprofile(None)
    return where


def every_point(make, call, check, cleanup=()) -> int:
    """``check(buffer)`` after ``call(buffer)`` stopped at each of its points, each on a fresh ``make()``; not after
    a stop inside one of the functions ``cleanup`` names (a second exception inside a ``finally``'s cleanup: no
    Python code can finish what it stops)."""
    point = 1
    while True:
        buf = make()
        where = stop_at(lambda: call(buf), point)
        if where is None:
            return point - 1
        if where not in cleanup:
            check(buf)
        point += 1


def item(v: int) -> dict:
    return {'obs': torch.full((2,), float(v)), 'act': v}


def made(buffer_type: str, storage: str):
    def make():
        buf = create_buffer(dict(type=buffer_type, replay_buffer_size=CAPACITY, seed=0, storage=dict(type=storage)))
        buf.push([item(i) for i in range(STORED)])
        return buf

    return make


def lock_free(buf) -> None:
    """Another thread's push finishes (the interrupted call left no lock taken)."""
    done = threading.Event()
    threading.Thread(target=lambda: (buf.push(item(77)), done.set()), daemon=True).start()
    assert done.wait(10), 'a push from another thread waited for a lock the interrupted call kept'


def items_of(buf, may_refuse: bool = False) -> list:
    """The stored items' (obs value, act) pairs, sampled through the public API: every one (naive), or those that a
    sample of as many by priority draws (advanced; ``may_refuse``: none has a priority yet, the sample is None)."""
    out = buf.sample(len(buf), replace=False) if buf.cfg.type == 'naive' else buf.sample(len(buf))
    if out is None and may_refuse:
        return []
    if isinstance(out, list):
        assert all(d is not None for d in out), f'a counted item has no data: {out}'
        return sorted({(float(d['obs'][0]), int(d['act'])) for d in out})
    return sorted({(float(o[0]), int(a)) for o, a in zip(out['obs'], out['act'])})


def restores(buf) -> None:
    """Its state loads into a fresh buffer of its config, which holds the same items."""
    fresh = create_buffer(dict(buf.cfg))
    fresh.load_state_dict(buf.state_dict())
    assert len(fresh) == len(buf)
    if not len(buf):
        return
    if buf.cfg.type == 'naive':
        assert items_of(fresh) == items_of(buf)
    else:  # (drawn by priority: some twice, others not; a stopped overwrite of a tensor row may mix old and new)
        items_of(fresh, may_refuse=True)


CASES = [(t, s) for t in ('naive', 'advanced') for s in ('list', 'tensor')]


@pytest.mark.parametrize('buffer_type,storage', CASES)
@pytest.mark.parametrize('pushed', [1, 2])
def test_a_push_into_free_slots_stopped_anywhere_counts_only_written_items(buffer_type, storage, pushed):
    new = [item(100 + i) for i in range(pushed)]
    before = [(float(i), i) for i in range(STORED)]

    after = sorted(before + [(float(d['act']), d['act']) for d in new])

    def check(buf):
        got = items_of(buf)
        if buffer_type == 'naive':  # every item: the old ones, with the new ones or without
            assert got in (before, after), got
        else:  # drawn by priority: a new item may not be drawn (its priority not yet written)
            assert set(got) <= set(after), got
        assert len(buf) in (STORED, STORED + pushed)
        restores(buf)
        lock_free(buf)

    points = every_point(made(buffer_type, storage), lambda b: b.push(new[0] if pushed == 1 else new), check)
    assert points > 5


@pytest.mark.parametrize(
    'buffer_type,storage,pushed',
    [(t, s, n) for t, s in CASES for n in (3, CAPACITY + 4)],  # (overwriting the oldest; more than it holds)
)
def test_a_push_that_evicts_stopped_anywhere_leaves_a_buffer_that_loads(buffer_type, storage, pushed):
    new = [item(100 + i) for i in range(pushed)]

    def check(buf):
        if len(buf):
            # (a list item of None fails here; a prioritized push of more than the capacity stopped before it wrote
            # the priorities leaves only items of priority 0: a sample refuses until pushes replace them)
            got = items_of(buf, may_refuse=buffer_type == 'advanced' and pushed > CAPACITY)
            assert len(got) == len(buf) or buffer_type == 'advanced'  # (drawn by priority: some twice)
        restores(buf)
        lock_free(buf)

    assert every_point(made(buffer_type, storage), lambda b: b.push(new), check) > 10


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_clear_stopped_anywhere_keeps_everything_or_nothing(storage):
    def check(buf):
        assert len(buf) in (0, STORED)
        if len(buf):
            assert items_of(buf) == [(float(i), i) for i in range(STORED)]
        restores(buf)
        lock_free(buf)

    assert every_point(made('naive', storage), lambda b: b.clear(), check) > 3


@pytest.mark.parametrize('verb', ['sample', 'why_not_sample'])
def test_a_sample_with_a_timeout_stopped_anywhere_releases_the_lock(verb):
    def call(buf):
        getattr(buf, verb)(4, timeout=5.0)

    def check(buf):
        lock_free(buf)
        done = threading.Event()
        threading.Thread(target=lambda: (buf.sample(2, timeout=1.0), done.set()), daemon=True).start()
        assert done.wait(10)
        restores(buf)  # (the sampled-data monitor kept a row its count of calls did not: no buffer loaded it)
        assert buf.sample(2) is not None  # (this thread too: its call's mark is not left behind)

    assert every_point(made('advanced', 'tensor'), call, check) > 10


def test_a_mixture_sample_stopped_anywhere_releases_every_member():
    def make():
        mix = create_buffer(
            dict(type='mixture', seed=0, members=dict(a=dict(type='naive'), b=dict(type='advanced', seed=1)))
        )
        mix.push([item(i) for i in range(4)], member='a')
        mix.push([item(i) for i in range(4)], member='b')
        return mix

    def check(mix):
        for name in ('a', 'b'):
            done = threading.Event()
            threading.Thread(target=lambda: (mix.push(item(9), member=name), done.set()), daemon=True).start()
            assert done.wait(10), f'member {name} stayed locked'

    # (a stop inside ``MemberLocks.release``, as the sample's ``finally`` releases the members, can keep a member)
    assert every_point(make, lambda m: m.sample(4, timeout=5.0), check, cleanup=('release',)) > 5


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_load_stopped_anywhere_keeps_later_pushes_in_the_buffer(storage):
    """A load stopped part-way leaves the old buffer or the loaded one in place for every later push: the single
    push's fast path was rebound to the loaded storage only after the counters' swap, so a stop between the two
    sent every later push into the replaced storage (counted, never sampled)."""
    source = made('naive', storage)()
    source.push([item(50 + i) for i in range(2)])
    state = source.state_dict()

    def check(buf):
        buf.push(item(77))
        assert (77.0, 77) in items_of(buf), 'the push went to a storage the buffer no longer reads'
        lock_free(buf)

    assert every_point(made('naive', storage), lambda b: b.load_state_dict(state), check) > 10


@pytest.mark.parametrize('storage', ['list', 'tensor'])
def test_a_sample_that_uses_items_up_stopped_anywhere_leaves_a_buffer_that_loads(storage):
    """``max_use=1``: each sample removes what it drew; a stop as the ring let them go left its head on a hole (a
    state no buffer loaded) and the use counts of emptied slots."""

    def make():
        buf = create_buffer(
            dict(type='naive', replay_buffer_size=CAPACITY, seed=0, max_use=1, storage=dict(type=storage))
        )
        buf.push([item(i) for i in range(STORED)])
        return buf

    def check(buf):
        restores(buf)
        buf.push(item(77))
        assert items_of(buf)  # (every counted item readable)
        lock_free(buf)

    assert every_point(make, lambda b: b.sample(3), check) > 10


@pytest.mark.parametrize('buffer_type', ['advanced', 'naive'])
def test_a_clear_of_used_items_stopped_anywhere_leaves_a_buffer_that_loads(buffer_type):
    def make():
        buf = made(buffer_type, 'tensor')()
        buf.sample(4)  # (use counts of the drawn items)
        return buf

    def check(buf):
        restores(buf)
        lock_free(buf)

    assert every_point(make, lambda b: b.clear(), check) > 3


class _Board:
    """A ``tb_logger`` (as TensorBoard's ``SummaryWriter``) that keeps nothing."""

    def add_scalar(self, *args, **kwargs):
        pass

    def flush(self):
        pass

    def close(self):
        pass


def test_a_first_push_under_a_periodic_report_stopped_anywhere_releases_the_lock():
    """The first push starts the periodic report, which reads its baseline under the buffer's lock on the caller's
    thread: a stop as that lock was taken kept it for good."""

    def make():
        return create_buffer(
            dict(type='naive', replay_buffer_size=CAPACITY, seed=0, periodic_thruput_seconds=60), _Board()
        )

    def check(buf):
        lock_free(buf)
        buf.close()

    assert every_point(make, lambda b: b.push(item(1)), check) > 5


def test_a_diverse_push_into_a_full_buffer_stopped_anywhere_lets_later_pushes_evict():
    """``gfn_diverse``: a stop after the evicted states left the diversity filter, before the new ones were written,
    made every later push that evicted those slots a ``KeyError`` (they were removed from the filter twice)."""
    g = torch.Generator().manual_seed(0)
    batches = [{'state': torch.randn(3, 3, generator=g), 'log_reward': torch.randn(3, generator=g)} for _ in range(8)]

    def make():
        buf = create_buffer(dict(type='gfn_diverse', replay_buffer_size=8, seed=0))
        buf.push({'state': torch.randn(8, 3, generator=g), 'log_reward': torch.randn(8, generator=g)})
        return buf

    def check(buf):
        for b in batches:
            buf.push(b)
        assert buf.sample(4)['state'].shape == (4, 3)
        done = threading.Event()
        threading.Thread(target=lambda: (buf.sample(1), done.set()), daemon=True).start()
        assert done.wait(10), 'a sample from another thread waited for a lock the interrupted call kept'

    assert every_point(make, lambda b: b.push(batches[0]), check) > 10
