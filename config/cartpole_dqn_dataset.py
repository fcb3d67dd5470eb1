"""DQN with uniform replay on CartPole-v1 that, once trained, writes 20 episodes of its policy as a D4RL file: the
offline data of cartpole_offline_to_online.py (which runs this config itself when the file is missing).

    ding-buffer train config/cartpole_dqn_dataset.py [--seed N] [--env-steps N]

Everything but `exp_name`, `seed` and `dataset_out` is cartpole_dqn_uniform.py's (DI-engine config layout).
"""

main_config = dict(
    exp_name='cartpole_dqn_dataset',
    log_dir=None,
    seed=100,  # a seed of its own: the fine-tuning runs' seeds 0, 1, 2, ... do not reuse it
    env=dict(env_id='CartPole-v1', max_env_step=50_000, eval_episodes=10, eval_freq=2_500, stop_value=475.0),
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
        other=dict(replay_buffer=dict(type='naive', replay_buffer_size=50_000, storage=dict(type='tensor'))),
    ),
    checkpoint=dict(freq=10_000, keep=2),
    # after training: 20 episodes of the trained policy, a random action 10% of the time, written in the D4RL layout
    dataset_out=dict(path='cartpole_dqn_episodes.hdf5', episodes=20, epsilon=0.1),
)
