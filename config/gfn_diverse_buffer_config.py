"""GFlowNet replay with keep-best capacity and a diversity filter (torchgfn's
NormBasedDiversePrioritizedReplayBuffer), DI-engine config layout.

    from ding_buffer import create_buffer
    buffer = create_buffer(main_config['policy']['other']['replay_buffer'], exp_name=main_config['exp_name'])
    buffer.push({'state': x_terminal, 'log_reward': log_r})   # dict of [B, ...] tensors, or a torchgfn container
    batch = buffer.sample(64)                                 # same kind back; None while empty
"""

main_config = dict(
    exp_name='gfn_diverse_buffer_demo',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='gfn_diverse',
                # maximum number of items; once full, the lowest log-rewards make room
                replay_buffer_size=10_000,
                # once full, an item must be farther than this (p-norm) from every stored item and every
                # better item of its batch; 0 rejects exact duplicates only; < 0 disables the filter
                cutoff_distance=0.0,
                p_norm_distance=1.0,
                # sample by softmax(log_reward) instead of uniformly; None = with replacement only when needed
                prioritized_sampling=False,
                sample_replacement=None,
                # truncate only when stored + incoming reaches 2 x capacity (waiting items are sampled too)
                lazy_sort=False,
                # field names of dict batches (the condition is concatenated to the state for distances)
                state_key='state',
                log_reward_key='log_reward',
                condition_key=None,
                device='cpu',
                seed=None,
                # size, log-reward min/mean/max, rejection rates, unique states every log_every pushes
                monitor=dict(tensorboard=False, log_every=100),
            ),
        ),
    ),
)
