"""The ready configs, installed with the package as ``ding_buffer.configs``.

``ding-buffer configs`` lists them; ``ding-buffer train NAME`` runs one by name (e.g. ``cartpole_dqn_per``) from an
installed wheel as well as from a checkout (``ding-buffer train config/cartpole_dqn_per.py``). Each file defines
``main_config`` (DI-engine's layout) and nothing else; none imports another.
"""
