"""Distributed trajectory-balance GFlowNet on HyperGrid in torchgfn's replay-manager pattern: one manager rank
owns a keep-best 'gfn' buffer and answers every push with a baseline log-reward; sampler ranks push trajectories
from the latest published policy (dropping those below the baseline); the learner trains on its own batches plus
replay from the manager and evaluates exactly as the local job.

    ding-buffer train config/hypergrid_tb_distributed.py --nproc 4     # manager + learner + 2 samplers
    torchrun --nproc_per_node 4 -m ding_buffer train config/hypergrid_tb_distributed.py
    mpirun -n 4 python -m ding_buffer train config/hypergrid_tb_distributed.py   # with distributed.backend='mpi'

Anything left out takes the default of ding_buffer.train.hypergrid.HYPERGRID_DEFAULTS.
"""

main_config = dict(
    job='hypergrid',
    exp_name='hypergrid_tb_distributed',
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
                type='gfn',
                replay_buffer_size=1_000,
                # keep the highest log-rewards when full (ties: the newest stay)
                prioritized_capacity=True,
                # sample with probability softmax(log_reward)
                prioritized_sampling=True,
                monitor=dict(tensorboard=False, log_every=100),
                # the manager owns this buffer; the learner and the samplers reach it with the backend below
                distributed=dict(
                    backend='torch',  # 'torch' | 'mpi' | 'ray'
                    manager_rank=-1,  # the last rank
                    timeout=60.0,  # a call fails with ManagerUnavailableError after this
                    heartbeat_seconds=2.0,
                    peer_timeout=20.0,  # the manager counts a silent sampler as lost
                    # torchgfn's manager pattern: the manager answers every push with baseline_log_reward (here
                    # the 10% quantile of the stored log-rewards once full) and workers drop trajectories below it
                    baseline_strategy='percentile',
                    baseline_percentile=0.1,
                    baseline_filtering=True,
                    baseline_refresh_after=5,
                ),
            ),
        ),
    ),
    # save every freq iterations, atomically, keeping the newest `keep`
    checkpoint=dict(freq=500, keep=2),
    # the learner publishes its policy every publish_freq iterations; a sampler pushes at most publish_freq
    # batches per published policy
    distributed_job=dict(publish_freq=10, learner_silence=300.0),
)
