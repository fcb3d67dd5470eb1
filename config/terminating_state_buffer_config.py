"""Terminating states and their log-rewards only (torchgfn's TerminatingStateBuffer): replay terminal states,
then re-sample trajectories to them with the backward policy.

    buffer = create_buffer(main_config['policy']['other']['replay_buffer'])
    buffer.add(trajectories)        # keeps trajectories.terminating_states and their log_rewards
    x = buffer.sample(64)           # a StatesContainer (torchgfn input) or {'state', 'log_reward'}
"""

main_config = dict(
    exp_name='terminating_state_buffer_demo',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='terminating_state',
                replay_buffer_size=10_000,
                prioritized_capacity=True,
                prioritized_sampling=False,
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
