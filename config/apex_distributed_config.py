"""Ape-X style distributed prioritized replay: one manager rank owns an `advanced` buffer, actors push,
the learner samples and updates priorities. Same code on every rank; the backend is one config key.

    buffer = create_buffer(main_config['policy']['other']['replay_buffer'])
    if isinstance(buffer, ReplayBufferManager):      # the manager rank (torch / mpi)
        buffer.run()                                  # serves until every worker has called close()
    else:                                             # RemoteBuffer: the IBuffer calls of a local buffer
        buffer.extend(batch); batch = buffer.sample(256, timeout=30.0); buffer.update(info); buffer.close()

Launch: torchrun --nproc_per_node 3 train.py | mpirun -n 3 python train.py | backend='ray' in any Ray job.
"""

main_config = dict(
    exp_name='apex_distributed',
    policy=dict(
        other=dict(
            replay_buffer=dict(
                type='advanced',
                replay_buffer_size=1_000_000,
                alpha=0.6,
                beta=0.4,
                storage=dict(type='tensor', device='cpu'),
                distributed=dict(
                    backend='torch',  # 'torch' (torchrun, gloo) | 'mpi' (mpirun) | 'ray' (named actor)
                    manager_rank=-1,  # the last rank owns the buffer
                    actor_name='ding_buffer_manager',  # ray only
                    namespace='ding_buffer',
                    timeout=60.0,  # every worker call raises ManagerUnavailableError after this
                    heartbeat_seconds=5.0,
                    peer_timeout=120.0,  # the manager counts a silent worker as lost
                    max_message_mb=2048,
                    remote_buffer_freq=1,
                    async_score=False,
                    max_reuse=None,  # e.g. 8: an item leaves after 8 samples (sets max_use)
                    checkpoint_path='apex_distributed/buffer.pt',  # written when the manager stops
                ),
            ),
        ),
    ),
)
