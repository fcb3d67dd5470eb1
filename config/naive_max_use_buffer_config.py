"""A uniform FIFO buffer whose items leave after a few uses -- the replay buffer of DI-engine's IMPALA configs
(``type='naive'`` with ``max_use``), plus the rate limiter, DI-engine config layout.

    buffer = create_buffer(main_config['policy']['other']['replay_buffer'])
    buffer.push(transitions)
    batch = buffer.sample(32, timeout=10.0)   # waits for data (SampleTimeoutError after 10 s)
"""

main_config = dict(
    exp_name='impala_buffer_demo',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='naive',
                replay_buffer_size=10_000,
                # an item is removed once it has been sampled this many times
                max_use=16,
                # pushed / sampled items kept within this range (DI-engine's thruput controller)
                thruput_controller=dict(
                    push_sample_rate_limit=dict(max=float('inf'), min=0.0),
                    window_seconds=30.0,
                    sample_min_limit_ratio=1.0,
                ),
                seed=None,
                storage=dict(type='tensor', device='cpu'),
            ),
        ),
    ),
)
