"""Offline-to-online DQN on CartPole-v1: a fresh agent fine-tunes on a 50/50 mixture of a trained policy's episodes
(a D4RL file) and its own online data, RLPD-style (DI-engine config layout).

    ding-buffer train config/cartpole_offline_to_online.py [--seed N] [--env-steps N]

When the dataset file does not exist yet, the command first trains `dataset_source` (cartpole_dqn_dataset.py), which
writes it, and then fine-tunes. Set the offline weight to 1 and the online weight to 0 for offline-only training
(the agent still acts, but learns only from the dataset); cartpole_dqn_uniform.py is the same agent from scratch.
"""

main_config = dict(
    exp_name='cartpole_offline_to_online',
    log_dir=None,
    seed=0,
    env=dict(env_id='CartPole-v1', max_env_step=50_000, eval_episodes=10, eval_freq=2_500, stop_value=475.0),
    policy=dict(
        device='cpu',
        model=dict(hidden_sizes=[128, 128]),
        discount_factor=0.99,
        nstep=1,  # the dataset holds one-step transitions
        learn=dict(
            batch_size=64,
            learning_rate=1e-3,
            updates_per_step=1,
            # learning starts at once: the dataset fills half of every batch (the online half needs 32 steps)
            warmup_steps=100,
            target_update_freq=500,
            double=True,
            huber_delta=1.0,
            grad_clip=10.0,
        ),
        collect=dict(eps_start=1.0, eps_end=0.05, eps_decay_steps=10_000),
        other=dict(
            replay_buffer=dict(
                type='mixture',
                weights=dict(offline=0.5, online=0.5),
                push_to='online',
                members=dict(
                    # the dataset, kept whole (never full)
                    offline=dict(
                        type='naive',
                        replay_buffer_size=100_000,
                        dataset=dict(path='cartpole_dqn_episodes.hdf5', format='d4rl'),
                    ),
                    # the agent's own transitions, FIFO
                    online=dict(type='naive', replay_buffer_size=50_000),
                ),
            ),
        ),
    ),
    checkpoint=dict(freq=10_000, keep=2),
    dataset_source='cartpole_dqn_dataset',
)
