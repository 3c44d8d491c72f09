"""Machine tuning, not RL (docs/design.md §3): :mod:`gapo.machine.threads` (the CPU thread
default, measured once per machine) and :mod:`gapo.machine.allocator` (glibc malloc thresholds,
so each step's activations are reused from the heap). Above ``gapo.policy`` (the thread probe
times a tiny policy), below ``gapo.rl``, which calls both when a trainer starts."""
