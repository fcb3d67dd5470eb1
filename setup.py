"""ding-buffer: replay buffers with DI-engine's API and C++-buffer speed."""

from setuptools import find_packages, setup

# torchgfn's runtime dependencies (its containers in the GFlowNet buffers' tests). torchgfn itself is installed
# with `pip install --no-deps torchgfn==2.4.1`: its metadata pins numpy<2, which it does not need (its containers
# and buffers run on numpy 2), and that pin would downgrade numpy for everything else.
ATARI_DEPS = ['gymnasium>=1.0', 'ale-py>=0.9', 'opencv-python-headless>=4']
TORCHGFN_DEPS = [
    'tensordict>=0.6',
    'torch_geometric>=2.6',
    'dill>=0.3.8',
    'einops>=0.6',
    'linear-attention-transformer>=0.19',
]

# Install torch first (README: PyTorch's CPU index on a CPU-only machine, `pip install torch==2.13.0` otherwise): the
# range below is then already satisfied, while a bare `torch` requirement on a machine without torch pulls the CUDA
# build from PyPI.
setup(
    name='ding-buffer',
    version='0.1.0',
    author='ding_buffer developers',
    license='Apache-2.0',
    license_files=['LICENSE'],
    keywords=['reinforcement learning', 'replay buffer', 'prioritized replay', 'GFlowNet', 'DI-engine', 'distributed'],
    description='Replay buffers for RL and GFlowNets with DI-engine\'s API: naive, episode, prioritized, distributed',
    long_description=open('README.md', encoding='utf-8').read(),
    long_description_content_type='text/markdown',
    # the ready configs (config/ in the checkout) install as the package ding_buffer.configs, so
    # `ding-buffer train cartpole_dqn_per` finds them by name from a wheel; py.typed: the annotations are for users
    packages=find_packages(include=['ding_buffer', 'ding_buffer.*']) + ['ding_buffer.configs'],
    package_dir={'ding_buffer.configs': 'config'},
    package_data={'ding_buffer': ['py.typed']},
    python_requires='>=3.10',
    install_requires=[
        'torch>=2.1',
        'numpy>=1.22',
        'easydict>=1.9',
        'tensorboard>=2.10',
    ],
    extras_require={
        # numba compiles the segment-tree kernels (prioritized replay); without it a numpy fallback runs.
        'fast': ['numba>=0.59'],
        'gfn': TORCHGFN_DEPS,
        # everything the suite imports (a fresh venv with this extra runs it all): the distributed tests start real
        # mpirun / Ray jobs (mpi4py needs Open MPI from the OS), scipy computes the chi-square tests' p-values,
        # pytest-xdist runs the suite in two processes, ruff checks the lint and format (pinned: its formatting
        # changes between minor versions)
        'test': [
            'pytest>=7',
            'pytest-timeout>=2.1',
            'pytest-xdist>=3.5',
            'hypothesis>=6',
            'scipy>=1.9',
            'ruff>=0.17,<0.18',
            'numba>=0.59',
            'gymnasium>=0.29',
            'matplotlib>=3.5',
            'tqdm>=4.60',
            'mpi4py>=3.1',
            'ray>=2.9',
            'h5py>=3.8',
        ]
        + TORCHGFN_DEPS
        + ATARI_DEPS,
        # Atari with frames stored once (storage.frames): the ALE (its ROMs ship with ale-py) and gymnasium's
        # AtariPreprocessing (which needs OpenCV) / FrameStackObservation wrappers
        'atari': ATARI_DEPS,
        'bench': ['cpprb>=10.7', 'torchrl>=0.4'],
        # distributed backends: 'torch' needs nothing more; 'mpi' needs Open MPI (apt-get install openmpi-bin
        # libopenmpi-dev) and mpi4py; 'ray' needs ray.
        'mpi': ['mpi4py>=3.1'],
        'ray': ['ray>=2.9'],
        'distributed': ['mpi4py>=3.1', 'ray>=2.9'],
        # offline datasets (ding_buffer.datasets): D4RL, Minari and DI-engine HDF5 files
        'datasets': ['h5py>=3.8'],
        # `ding-buffer train` / `plot`: environments, learning curves, progress bar (and the compiled trees).
        'examples': ['gymnasium>=0.29', 'matplotlib>=3.5', 'tqdm>=4.60', 'numba>=0.59'],
    },
    entry_points={'console_scripts': ['ding-buffer=ding_buffer.cli:console_main']},
    classifiers=[
        'Development Status :: 4 - Beta',
        'Intended Audience :: Science/Research',
        'Operating System :: POSIX :: Linux',
        'Programming Language :: Python :: 3',
        'Programming Language :: Python :: 3 :: Only',
        'Programming Language :: Python :: 3.10',
        'Programming Language :: Python :: 3.11',
        'Programming Language :: Python :: 3.12',
        'Programming Language :: Python :: 3.13',
        'Topic :: Scientific/Engineering :: Artificial Intelligence',
        'Typing :: Typed',
    ],
)
