"""Prioritized replay (PER) for DQN-style learners, DI-engine config layout.

from ding_buffer import create_buffer
buffer = create_buffer(main_config['policy']['other']['replay_buffer'], exp_name=main_config['exp_name'])
batch = buffer.sample(256, cur_learner_iter=it)          # adds 'IS', 'priority', 'use', 'staleness'
buffer.update({'replay_unique_id': batch['replay_unique_id'],
               'replay_buffer_idx': batch['replay_buffer_idx'], 'priority': td_error.abs()})
"""

main_config = dict(
    exp_name='advanced_buffer_demo',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='advanced',
                # maximum number of transitions; the oldest is overwritten first
                replay_buffer_size=100_000,
                # leaf = priority ** alpha (0 = uniform sampling)
                alpha=0.6,
                # importance-sampling exponent, annealed linearly to 1 over anneal_step sample calls
                beta=0.4,
                anneal_step=100_000,
                # added to every updated priority so nothing becomes unsampleable
                eps=1e-5,
                # remove an item after this many samples / when this many learner iterations old
                max_use=float('inf'),
                max_staleness=float('inf'),
                # new items get the max priority stored now (True) or ever set (False, DI-engine)
                max_priority_within_buffer=False,
                # the running max takes the priority an update stores, priority + eps (True: DI-engine's
                # PriorityExperienceReplay) or the one given (False: its AdvancedReplayBuffer)
                max_priority_plus_eps=False,
                seed=None,
                # which items a sample draws: {} or dict(type='prioritized'), by priority with the keys above
                sampler={},
                # copy items on push/sample (only needed when the caller mutates them afterwards)
                deepcopy=False,
                # items are dicts whose payload is a file at item['data_id'], deleted when the item leaves
                enable_track_used_data=False,
                # your own removal rules by name: [dict(type='my_rule', ...)] (REMOVER_REGISTRY)
                removers=[],
                thruput_controller=dict(
                    # allowed pushed/sampled ratio over a decaying window; the defaults never refuse
                    push_sample_rate_limit=dict(max=float('inf'), min=0),
                    window_seconds=30,
                    # sample only when count >= ratio * batch size
                    sample_min_limit_ratio=1,
                ),
                monitor=dict(
                    sampled_data_attr=dict(average_range=5, print_freq=200),
                    periodic_thruput=dict(seconds=60),
                    # write TensorBoard under ./<exp_name>/log/<instance_name>/ when no tb_logger is passed
                    tensorboard=False,
                ),
                # 'tensor': one preallocated tensor per field, batches come back as one dict of tensors
                # (output='items': as per-item dicts, the layout DI-engine's policies collate); frames=dict(...)
                # stores image observation stacks one frame a transition (Atari: see docs/storages.md)
                storage=dict(type='tensor', device='cpu', memmap_dir=None, output=None, frames=None),
            ),
        ),
    ),
)
