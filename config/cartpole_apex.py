"""Ape-X DQN on CartPole-v1 over the distributed buffer manager (DI-engine config layout).

    ding-buffer train config/cartpole_apex.py --nproc 4          # manager + learner + 2 actors on this machine
    torchrun --nproc_per_node 4 -m ding_buffer train config/cartpole_apex.py
    mpirun -n 4 python -m ding_buffer train config/cartpole_apex.py   # with distributed.backend='mpi'

The backend is one key: policy.other.replay_buffer.distributed.backend = 'torch' | 'mpi' | 'ray'. Anything left
out takes the default of ding_buffer.train.apex.APEX_DEFAULTS.
"""

main_config = dict(
    job='apex',
    exp_name='cartpole_apex',
    log_dir=None,
    seed=0,
    env=dict(
        env_id='CartPole-v1',
        # transitions stored by all actors together
        max_env_step=40_000,
        eval_episodes=10,
        eval_freq=2_500,
        stop_value=475.0,
    ),
    policy=dict(
        device='cpu',
        model=dict(hidden_sizes=[128, 128]),
        discount_factor=0.99,
        nstep=3,
        learn=dict(
            batch_size=64,
            learning_rate=1e-3,
            # gradient steps per stored transition (the learner waits for the actors beyond it)
            updates_per_step=1.0,
            warmup_steps=1_000,
            target_update_freq=500,
            double=True,
            huber_delta=1.0,
            grad_clip=10.0,
        ),
        other=dict(
            replay_buffer=dict(
                type='advanced',
                replay_buffer_size=50_000,
                alpha=0.6,
                beta=0.4,
                anneal_step=30_000,
                storage=dict(type='tensor', device='cpu'),
                distributed=dict(
                    backend='torch',  # 'torch' | 'mpi' | 'ray'
                    manager_rank=-1,  # the last rank owns the buffer
                    timeout=60.0,  # a worker call fails with ManagerUnavailableError after this
                    heartbeat_seconds=2.0,
                    peer_timeout=20.0,  # the manager counts a silent worker (e.g. a killed actor) as lost
                ),
            ),
        ),
    ),
    apex=dict(
        eps_base=0.4,
        eps_alpha=7.0,
        push_batch=50,
        weight_sync_steps=200,
        publish_freq=50,
        buffer_log_freq=200,
        throttle_actors=True,
        learner_silence=300.0,
        sample_timeout=30.0,
    ),
    checkpoint=dict(freq=20_000, keep=2),
)
