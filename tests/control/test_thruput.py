"""The throughput controller (``ding_buffer.control.thruput.ThruputController``, the ``thruput_controller``
config section) on a fake clock: its push and sample counters decay to 1 % over ``window_seconds`` in whole-second
steps, pushes and samples are admitted by the push/sample rate limits, and invalid limits are refused naming the
key (by the part and by a buffer's config)."""

import pytest

from ding_buffer import create_buffer
from ding_buffer.control.thruput import ThruputController


class FakeClock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _controller(max_rate=2.0, min_rate=0.5, window=5, clock=None):
    cfg = dict(push_sample_rate_limit=dict(max=max_rate, min=min_rate), window_seconds=window)
    return ThruputController(cfg, clock=clock or FakeClock())


@pytest.mark.parametrize('window', [1, 5, 30])
def test_thruput_counters_decay_to_one_percent_after_the_window(window):
    clock = FakeClock()
    ctl = _controller(window=window, clock=clock)
    ctl.on_push(100)
    ctl.on_sample(50)
    clock.t += window
    assert ctl.push_count == pytest.approx(1.0, abs=1e-9)
    assert ctl.sample_count == pytest.approx(0.5, abs=1e-9)
    clock.t += window  # another window: x0.01 again
    assert ctl.push_count == pytest.approx(0.01, abs=1e-9)


def test_thruput_decay_is_in_whole_second_steps():
    clock = FakeClock()
    ctl = _controller(window=5, clock=clock)
    ctl.on_push(100)
    step = 0.01 ** (1 / 5)
    clock.t += 0.999
    assert ctl.push_count == 100.0  # a fraction of a second does not decay
    clock.t += 0.001
    assert ctl.push_count == pytest.approx(100 * step, abs=1e-9)
    clock.t += 1.5  # 2.5 s since construction: two ticks
    assert ctl.push_count == pytest.approx(100 * step**2, abs=1e-9)
    ctl.on_push(10)  # counting after a decay
    clock.t += 0.4  # 2.9 s: still two ticks
    assert ctl.push_count == pytest.approx(100 * step**2 + 10, abs=1e-9)
    clock.t += 0.2  # 3.1 s: third tick applies to everything counted so far
    assert ctl.push_count == pytest.approx((100 * step**2 + 10) * step, abs=1e-9)


def test_thruput_rules_with_a_fake_clock():
    clock = FakeClock()
    ctl = _controller(clock=clock)
    assert ctl.can_push(10**6)[0]  # nothing sampled yet: pushes are always allowed
    assert not ctl.can_sample(1)[0]  # 0 / 1 < .5
    ctl.on_push(30)
    assert [ctl.can_sample(n)[0] for n in (19, 60, 61)] == [True, True, False]
    ctl.on_sample(57)
    assert ctl.can_push(84)[0] and not ctl.can_push(85)[0]  # (30 + 84) / 57 = 2
    assert 'max' in ctl.can_push(85)[1]
    clock.t += 5  # both decay by 0.01: the push/sample ratio is unchanged, but n weighs more
    assert ctl.push_count == pytest.approx(0.3) and ctl.sample_count == pytest.approx(0.57)
    assert not ctl.can_push(1)[0]  # (0.3 + 1) / 0.57 > 2
    inactive = ThruputController(dict(push_sample_rate_limit=dict(max=float('inf'), min=0), window_seconds=30))
    inactive.on_push(5)
    inactive.on_sample(500)
    assert not inactive.active and inactive.can_sample(10**9)[0] and inactive.can_push(10**9)[0]
    assert inactive.push_count == 0 and inactive.sample_count == 0


@pytest.mark.parametrize(
    'kwargs,key',
    [
        (dict(max_rate=1.0, min_rate=2.0), 'thruput_controller.push_sample_rate_limit'),
        (dict(min_rate=-1), 'thruput_controller.push_sample_rate_limit'),
        (dict(max_rate=0.0, min_rate=0.0), 'thruput_controller.push_sample_rate_limit'),
        (dict(max_rate=float('nan')), 'thruput_controller.push_sample_rate_limit'),
        # an infinite min refuses every sample, pushes never (max inf): no sample could ever be drawn
        (dict(max_rate=float('inf'), min_rate=float('inf')), 'thruput_controller.push_sample_rate_limit'),
        (dict(max_rate=float('inf'), min_rate=10**400), 'thruput_controller.push_sample_rate_limit'),
        (dict(max_rate=10**400), 'thruput_controller.push_sample_rate_limit'),  # (no float: named, no OverflowError)
        (dict(window=10**400), 'thruput_controller.window_seconds'),
        (dict(window=0), 'thruput_controller.window_seconds'),
        (dict(window=-3), 'thruput_controller.window_seconds'),
    ],
)
def test_thruput_invalid_limits_raise_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=key.replace('.', r'\.')):
        _controller(**kwargs)
    cfg = dict(
        push_sample_rate_limit=dict(max=kwargs.get('max_rate', 2.0), min=kwargs.get('min_rate', 0)),
        window_seconds=kwargs.get('window', 5),
    )
    with pytest.raises(ValueError, match=key.replace('.', r'\.')):
        create_buffer(dict(type='advanced', replay_buffer_size=8, thruput_controller=cfg))
