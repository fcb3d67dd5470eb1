"""DQN with prioritized replay and 3-step returns on Atari Pong, frames stored once (DI-engine config layout).

    pip install -e ".[examples,atari]"
    ding-buffer train config/pong_dqn_per.py [--seed N] [--env-steps N] [--resume RUN_DIR] [--device cuda]

The replay keeps each 84 x 84 frame once (storage.frames): 100k transitions take about 0.7 GB instead of 5.6 GB,
and the buffer builds the frame stacks and the 3-step returns when it samples. A full run (10M env steps, the
usual Pong budget) wants a GPU and about a day; on a CPU a short run (--env-steps 20000) starts, fills, learns,
checkpoints and resumes in a few minutes, without learning Pong. A 1M-transition replay needs about 7.1 GB.
"""

main_config = dict(
    exp_name='pong_dqn_per',
    log_dir=None,
    seed=0,
    env=dict(
        env_id='PongNoFrameskip-v4',
        # AtariPreprocessing (frame skip 4, 84 x 84 grey, no-op starts) + FrameStackObservation(4)
        wrapper='atari',
        max_env_step=10_000_000,
        eval_episodes=1,
        eval_freq=250_000,
        stop_value=20.0,
        # 27,000 agent steps = 108,000 frames: the usual 30-minute cap of an Atari episode
        max_episode_steps=108_000,
    ),
    policy=dict(
        device='cpu',
        model=dict(type='nature_cnn'),
        discount_factor=0.99,
        # n-step returns are built by the buffer (storage.frames.n_step), not by the trainer
        nstep=1,
        learn=dict(
            batch_size=32,
            learning_rate=1e-4,
            updates_per_step=1,
            train_freq=4,
            warmup_steps=10_000,
            target_update_freq=2_500,
            double=True,
            huber_delta=1.0,
            grad_clip=10.0,
        ),
        collect=dict(eps_start=1.0, eps_end=0.01, eps_decay_steps=250_000),
        other=dict(
            replay_buffer=dict(
                type='advanced',
                replay_buffer_size=100_000,
                alpha=0.6,
                beta=0.4,
                anneal_step=2_500_000,
                storage=dict(
                    type='tensor',
                    device='cpu',
                    # obs / next_obs: [4, 84, 84] uint8 stacks, one frame stored a step; 3-step returns at sample
                    frames=dict(key='obs', next_key='next_obs', n_step=3, gamma=0.99),
                ),
                monitor=dict(
                    sampled_data_attr=dict(average_range=5, print_freq=2_500), periodic_thruput=dict(seconds=60)
                ),
            ),
        ),
    ),
    checkpoint=dict(freq=250_000, keep=2),
)
