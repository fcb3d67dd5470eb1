"""Prioritized sequence replay (R2D2): the episode buffer on tensor storage with prioritized windows, DI-engine
config layout.

    buffer = create_buffer(main_config['policy']['other']['replay_buffer'])
    buffer.push(episode)                                  # dict of [T, ...] tensors, or [list_of_transition_dicts]
    batch = buffer.sample(64)                             # [64, 80, ...] windows + 'mask', 'priority', 'IS' [64]
    buffer.update({'replay_unique_id': batch['replay_unique_id'], 'replay_buffer_idx': batch['replay_buffer_idx'],
                   'priority': td_priority})              # [64] per window, or [64, 80] per step
"""

main_config = dict(
    exp_name='r2d2_buffer_demo',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='episode',
                # at most this many episodes ...
                replay_buffer_size=5_000,
                # ... and at most this many transitions (oldest whole episodes are evicted first)
                max_transitions=1_000_000,
                # episodes shorter than unroll_len give one window over their steps (zero-padded, with a mask)
                pad_short_episodes=True,
                # window priority = eta * max + (1 - eta) * mean of its step priorities; drawn with
                # probability priority ** alpha, importance weights (p / p_min) ** (-alpha * beta)
                sampler=dict(type='prioritized', unroll_len=80, alpha=0.9, beta=0.6, eta=0.9, eps=1e-5, anneal_step=0),
                # optional parts compose too, e.g. drop an episode once its windows were drawn 8 times
                max_use=float('inf'),
                seed=None,
                storage=dict(type='tensor', device='cpu', memmap_dir=None),
            ),
        ),
    ),
)
