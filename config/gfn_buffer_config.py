"""GFlowNet replay: keep the best log-rewards and sample by reward (torchgfn's ReplayBuffer with
prioritized_capacity and prioritized_sampling), DI-engine config layout.

    buffer = create_buffer(main_config['policy']['other']['replay_buffer'])
    buffer.push({'state': x_terminal, 'log_reward': log_r, 'actions': a})   # or buffer.add(trajectories)
    batch = buffer.sample(64)
"""

main_config = dict(
    exp_name='gfn_buffer_demo',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='gfn',
                replay_buffer_size=10_000,
                # True: keep the highest log-rewards (ties: the newest stay); False: keep the newest (FIFO)
                prioritized_capacity=True,
                # sample with probability softmax(log_reward)
                prioritized_sampling=True,
                sample_replacement=None,
                lazy_sort=False,
                state_key='state',
                log_reward_key='log_reward',
                condition_key=None,
                device='cpu',
                seed=None,
                monitor=dict(tensorboard=False, log_every=100),
            ),
        ),
    ),
)
