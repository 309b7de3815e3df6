"""Users' own ``@triton.autotune`` kernels (Liger-Kernel's, flash-linear-attention's, a
team's own), tuned once per cluster with no code change (docs/user-kernels.md).

A part of the switch (tunecache.switch, part ``user_kernels``): with ``TUNECACHE_DB`` set,
the autoload hook installs it right after ``triton.runtime.autotuner`` is imported, before
any kernel is decorated; ``tunecache.enable()`` installs it too. Every autotuner of the
process then asks the database for a key before benchmarking it, one process tunes each
key while its peers wait, and the winner and every config's time are stored (kind
``user_kernel``). ``TUNECACHE_SHARE=-user_kernels`` leaves Triton's autotuner alone.

- tuning_keys.py: the key of one tuning, a config's id, and how far two tunings are apart;
- sharing.py: the tuning protocol for one key, the counters, the warnings;
- autotuner.py: what changes on Triton's ``Autotuner`` (the part), through the ledger;
- calls.py: how a tuned call is recorded, for ``tunecache warm --user-kernels``;
- warm.py: that warm's selection and calls.
"""
