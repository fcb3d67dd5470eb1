"""DQN with prioritized replay on CartPole-v1 (DI-engine config layout).

    ding-buffer train config/cartpole_dqn_per.py [--seed N] [--env-steps N] [--resume RUN_DIR] [--device cpu]

Every knob a user tunes is here; anything left out takes the default of ding_buffer.train.config.TRAIN_DEFAULTS.
"""

main_config = dict(
    exp_name='cartpole_dqn_per',
    # runs go to <log_dir>/<exp_name>_seed<seed>/ (None: the working directory)
    log_dir=None,
    seed=0,
    env=dict(
        env_id='CartPole-v1',
        max_env_step=50_000,
        # greedy evaluation: episodes per evaluation, env steps between evaluations, "solved" threshold
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
            updates_per_step=1,
            warmup_steps=1_000,
            target_update_freq=500,
            double=True,
            huber_delta=1.0,
            grad_clip=10.0,
        ),
        collect=dict(eps_start=1.0, eps_end=0.05, eps_decay_steps=10_000),
        other=dict(
            replay_buffer=dict(
                type='advanced',
                replay_buffer_size=50_000,
                alpha=0.6,
                beta=0.4,
                # beta reaches 1 after this many sample calls (one per gradient step)
                anneal_step=50_000,
                max_use=float('inf'),
                max_staleness=float('inf'),
                storage=dict(type='tensor', device='cpu'),
                monitor=dict(
                    sampled_data_attr=dict(average_range=5, print_freq=500), periodic_thruput=dict(seconds=30)
                ),
            ),
        ),
    ),
    # save every freq env steps, atomically, keeping the newest `keep`
    checkpoint=dict(freq=10_000, keep=2),
)
