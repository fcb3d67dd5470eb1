"""Trajectory-balance GFlowNet on torchgfn's HyperGrid, replaying from torchgfn's own
NormBasedDiversePrioritizedReplayBuffer: the reference for hypergrid_tb_gfn_diverse.py (same capacity, cutoff and
p-norm; torchgfn's buffer samples uniformly, as that config does), DI-engine config layout.

    ding-buffer train config/hypergrid_tb_torchgfn_diverse.py [--seed N] [--iterations N] [--resume RUN_DIR]
"""

main_config = dict(
    job='hypergrid',
    exp_name='hypergrid_tb_torchgfn_diverse',
    # runs go to <log_dir>/<exp_name>_seed<seed>/ (None: the working directory)
    log_dir=None,
    seed=0,
    env=dict(
        # the grid {0..height-1}^ndim and its 'original' reward R0 + R1 * outer ring + R2 * band (4 corner modes
        # in 2-D: a state is a mode state iff its reward is R0 + R1 + R2)
        ndim=2,
        height=16,
        R0=0.1,
        R1=0.5,
        R2=2.0,
        # evaluate every eval_freq iterations on eval_samples terminating states: 'fresh' from the policy, or
        # 'visited' (the last ones sampled in training)
        eval_freq=100,
        eval_samples=20_000,
        eval_source='fresh',
    ),
    policy=dict(
        device='cpu',
        # PF and PB are MLPs sharing a trunk; uniform_pb=True fixes PB to uniform over the parents
        model=dict(hidden_dim=256, n_hidden_layers=2, uniform_pb=False),
        learn=dict(
            iterations=2_000,
            # on-policy trajectories per iteration, and replayed ones once the buffer holds replay_warmup items
            batch_size=16,
            replay_batch_size=16,
            replay_warmup=64,
            learning_rate=1e-3,
            logZ_learning_rate=0.1,
            init_logZ=0.0,
            grad_clip=1.0,
        ),
        # probability of a uniformly random valid action at each on-policy step (0: pure on-policy)
        collect=dict(epsilon=0.0),
        other=dict(
            replay_buffer=dict(
                type='torchgfn:NormBasedDiversePrioritizedReplayBuffer',
                replay_buffer_size=1_000,
                cutoff_distance=0.0,
                p_norm_distance=1.0,
            ),
        ),
    ),
    # save every freq iterations, atomically, keeping the newest `keep`
    checkpoint=dict(freq=500, keep=2),
)
