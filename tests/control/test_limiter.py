"""The push / sample gate (``ding_buffer.control.limiter``): the default section and its check, the minimum-size
rule against a reference, the never-stall rule on a random push / sample walk (fake clock), the blocking ``wait``
and the counters' save / restore (a bad state refused, the gate unchanged)."""

import threading

import numpy as np
import pytest

from ding_buffer.control.limiter import RateLimiter, limiter_checks, limiter_config
from ding_buffer.control.thruput import ThruputController
from ding_buffer.errors import SampleTimeoutError


def _limiter(min_ratio=1.0, lo=0.0, hi=float('inf')):
    cfg = limiter_config(min_ratio)
    cfg['push_sample_rate_limit'] = dict(max=hi, min=lo)
    now = [0.0]
    lim = RateLimiter(cfg, threading.RLock())
    lim.swap(ThruputController(cfg, clock=lambda: now[0]))  # the same gate on a fake clock
    return lim, now


def test_default_section_is_inactive_fresh_and_checked():
    a, b = limiter_config(0.0), limiter_config(0.0)
    assert a == b and a['push_sample_rate_limit'] is not b['push_sample_rate_limit']  # no shared default
    lim = RateLimiter(a, threading.RLock())
    assert not lim.active and not lim.checks  # the defaults allow everything
    assert lim.why_not(count=1, size=10**6) == '' and lim.can_push(10**6, count=0) == (True, '')
    assert lim.why_not(count=0, size=1) == 'nothing is stored'
    ((key, (ok, expected)),) = limiter_checks(0.5).items()
    assert key == 'thruput_controller.sample_min_limit_ratio' and expected == 'a number >= 0.5'
    assert ok(0.5) and ok(3) and not ok(0.49) and not ok(float('inf'))  # inf: no sample could ever be drawn
    assert not ok(10**400) and not ok(float('nan'))  # (no float holds 10**400: refused, not an OverflowError later)


@pytest.mark.parametrize('min_ratio', [0.5, 1.0, 2.0])
def test_minimum_size_rule_matches_reference(min_ratio):
    lim, _ = _limiter(min_ratio)
    assert lim.checks and not lim.active
    for count in range(1, 20):
        for size in range(1, 12):
            why = lim.why_not(count, size)
            assert (why == '') == (count >= min_ratio * size), (count, size, why)
            if why:
                assert why == f"{count} items < sample_min_limit_ratio {min_ratio:g} x batch {size}"


def test_random_walk_never_stalls_and_overrides_the_ratio_only_when_the_other_call_is_refused_too():
    lim, now = _limiter(min_ratio=1.0, lo=1.0, hi=1.0)  # DI-engine's rules alone would deadlock here
    rng = np.random.default_rng(0)
    count, seen = 0, {'push_refused': 0, 'sample_refused': 0, 'push_override': 0, 'sample_override': 0}
    for _ in range(2000):
        tc = lim.thruput
        ratio_push, ratio_sample = tc.can_push(8)[0], tc.can_sample(32)[0]  # DI-engine's two rules alone
        sample_rules = count >= 1.0 * 32 and ratio_sample  # a sample by its own rules (minimum size, ratio)
        push_ok, why = lim.can_push(8, count)[0], lim.why_not(count, 32)
        sample_ok = why == ''
        assert push_ok or sample_ok, (count, tc.state_dict())
        assert push_ok == (ratio_push or not sample_rules)  # a refused push goes when a sample would not
        assert sample_ok == (count >= 32 and (ratio_sample or not ratio_push))  # and the other way round
        seen['push_override'] += push_ok and not ratio_push
        seen['sample_override'] += sample_ok and not ratio_sample
        seen['push_refused'] += not push_ok
        seen['sample_refused'] += not sample_ok
        if push_ok and (not sample_ok or rng.random() < 0.5):
            lim.on_push(8)
            count = min(count + 8, 64)
        else:
            lim.on_sample(32)
        now[0] += float(rng.random() < 0.3)
    assert min(seen.values()) > 0, seen  # every branch was exercised


def test_wait_times_out_naming_what_and_why_and_returns_when_allowed():
    lock = threading.RLock()
    lim = RateLimiter(limiter_config(0.0), lock)
    calls = []
    with lock:  # the buffer's lock: wait runs holding it and releases it while waiting
        assert lim.wait(lambda: calls.append(1) or 'empty', None, 'sample', lambda: None) == 'empty'
        assert calls == [1]  # timeout=None: evaluated once
        with pytest.raises(SampleTimeoutError, match=r"sample 4 within 0.1s: empty"):
            lim.wait(lambda: 'empty', 0.1, 'sample 4', lambda: None)
        assert lim.waiting == 0
        ready, inside = threading.Event(), []

        def push():
            with lock:  # taken while the sampler waits (wait released it)
                inside.append(lim.waiting)
                ready.set()
                lim.on_push(1)

        pusher = threading.Thread(target=push)
        pusher.start()
        assert lim.wait(lambda: '' if ready.is_set() else 'empty', 60.0, 'sample', lambda: None) == ''  # woken
        assert inside == [1] and lim.waiting == 0  # counted while waiting (a push notifies only then)
        with pytest.raises(RuntimeError, match='closed'):
            lim.wait(lambda: 'empty', 5.0, 'sample', lambda: (_ for _ in ()).throw(RuntimeError('closed')))
        assert lim.waiting == 0
    pusher.join()


def test_counters_round_trip_and_bad_state_changes_nothing():
    lim, now = _limiter(lo=0.5, hi=2.0)
    lim.on_push(40)
    lim.on_sample(32)
    saved = lim.state_dict()
    assert saved == {'push': 40.0, 'sample': 32.0}
    other, _ = _limiter(lo=0.5, hi=2.0)
    other.swap(other.restored(saved))
    assert other.state_dict() == saved
    assert [x.can_push(n, 32)[0] for x in (lim, other) for n in (24, 25)] == [True, False] * 2  # max 2: 64 / 32
    for bad in ({'push': -1.0, 'sample': 0.0}, {'push': 1.0, 'sample': float('nan')}):
        with pytest.raises(ValueError, match='invalid thruput counters'):
            lim.restored(bad)
    assert lim.state_dict() == saved
    now[0] = 30.0  # a window later both counters are x0.01 (the ratio stays)
    assert lim.state_dict() == pytest.approx({'push': 0.4, 'sample': 0.32})


def test_a_push_goes_while_too_few_items_are_stored_for_a_draw_without_replacement():
    """naive (no minimum-size rule) draws without replacement: with fewer items stored than the batch, its samples
    are refused, and the never-stall rule looked only at an empty buffer, so every push was refused by the ratio
    too -- for good (decay scales both counters alike)."""
    from ding_buffer import create_buffer

    limit = dict(push_sample_rate_limit=dict(max=1.0, min=0.0), window_seconds=30.0)
    buf = create_buffer(dict(type='naive', replay_buffer_size=100, max_use=1, seed=0, thruput_controller=limit))
    assert buf.push([{'x': i} for i in range(12)]) == 12
    assert buf.sample(8) is not None  # the 8 drawn leave (max_use=1): 4 stay, pushed / sampled is 12 / 8
    assert buf.sample(8) is None and buf.count() == 4
    assert buf.push([{'x': i} for i in range(4)]) == 4  # refused by the ratio alone; the sample could not go
    assert buf.sample(8) is not None


def test_a_push_over_the_limit_is_refused_while_a_sample_with_replacement_can_draw():
    """The never-stall rule lets a push through only when a sample could not go; a draw with replacement from
    fewer items than the batch can, so such a push stays refused by the ratio."""
    from ding_buffer import create_buffer

    limit = dict(push_sample_rate_limit=dict(max=1.0, min=0.0), window_seconds=1e6)
    items = [{'x': i} for i in range(10)]
    for cfg, kw in (
        (dict(type='deque', priority=True), {}),
        (dict(type='naive'), dict(replace=True)),
    ):
        buf = create_buffer(dict(cfg, replay_buffer_size=100, seed=0, thruput_controller=limit))
        assert buf.push(items) == 10
        assert buf.sample(12, **kw) is not None  # pushed / sampled: 10 / 12
        assert buf.push(items[:8]) == 0 and buf.count() == 10  # 18 / 12 > 1, and a sample of 12 still draws


def test_the_never_stall_rule_asks_the_table_again_and_sees_used_up_tracked_items(tmp_path):
    """A sample refused by the table let every later push past the ratio until the next sample, though pushes had
    made the sample possible; and a named sampler's table did not report that every item was used up (kept for
    enable_track_used_data), so samples and pushes were refused forever."""
    from ding_buffer import create_buffer

    limit = dict(push_sample_rate_limit=dict(max=2.0, min=0.0), window_seconds=1e6)
    buf = create_buffer(dict(type='naive', replay_buffer_size=10_000, seed=0, thruput_controller=limit))
    assert buf.push([{'x': i} for i in range(8)]) == 8 and buf.sample(8) is not None
    assert buf.sample(16) is None  # 8 items: the table cannot draw 16 without replacement
    assert buf.push([{'x': i} for i in range(8)]) == 8  # the never-stall rule: the sample could not go
    assert buf.push([{'x': i} for i in range(1000)]) == 0  # now it could: the ratio refuses (16 / 8 > 2)

    def files(n, start):
        out = []
        for i in range(start, start + n):
            (tmp_path / f'{i}.bin').write_bytes(b'')
            out.append({'data_id': str(tmp_path / f'{i}.bin'), 'x': i})
        return out

    limit = dict(push_sample_rate_limit=dict(max=1.0, min=0.0), window_seconds=1e6)
    cfg = dict(type='advanced', replay_buffer_size=100, seed=0, max_use=1, enable_track_used_data=True)
    tracked = create_buffer(dict(cfg, sampler=dict(type='uniform'), thruput_controller=limit))
    assert tracked.push(files(1, 0)) == 1 and tracked.sample(1) is not None  # its one item is used up, and kept
    assert tracked.sample(1) is None and 'used up' in tracked.why_not_sample(1)
    assert tracked.push(files(4, 10)) == 4 and tracked.sample(1) is not None
    tracked.close()
