"""A uniform replay buffer for an off-policy learner (DQN/SAC style), DI-engine config layout.

from ding_buffer import create_buffer
buffer = create_buffer(main_config['policy']['other']['replay_buffer'], exp_name=main_config['exp_name'])
"""

main_config = dict(
    exp_name='naive_buffer_demo',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='naive',
                # maximum number of transitions; the oldest is overwritten first
                replay_buffer_size=100_000,
                # copy items on push/sample (only needed when the caller mutates them afterwards)
                deepcopy=False,
                # None: seeded from numpy's global RNG; an int makes sampling reproducible on its own
                seed=None,
                # 'tensor': one preallocated tensor per field, batches come back as one dict of tensors
                storage=dict(type='tensor', device='cpu', memmap_dir=None),
            ),
        ),
    ),
)
