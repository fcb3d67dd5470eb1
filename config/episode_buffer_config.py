"""An episode buffer for recurrent learners (R2D2-style sequence sampling), DI-engine config layout.

buffer = create_buffer(main_config['policy']['other']['replay_buffer'])
buffer.push(episode)                      # dict of [T, ...] tensors, or [list_of_transition_dicts]
batch = buffer.sample(32, unroll_len=40)  # [32, 40, ...] windows plus 'mask'
"""

main_config = dict(
    exp_name='episode_buffer_demo',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='episode',
                # at most this many episodes ...
                replay_buffer_size=5_000,
                # ... and at most this many transitions (oldest whole episodes are evicted first)
                max_transitions=1_000_000,
                # episodes shorter than unroll_len give one zero-padded window with a mask
                pad_short_episodes=True,
                seed=None,
                storage=dict(type='tensor', device='cpu', memmap_dir=None),
            ),
        ),
    ),
)
