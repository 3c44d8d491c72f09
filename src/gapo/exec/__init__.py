"""The execution runtime, below ``gapo.tasks`` (docs/design.md §3): what runs untrusted or slow
code for a verifier and bounds it.

- :mod:`gapo.exec.sandbox` (with ``sandbox_ns``, ``sandbox_boot``, ``sandbox_proc``): run one
  program in a namespace/cgroup/rlimit sandbox (docs/sandbox.md);
- :mod:`gapo.exec.judge`: the harness run inside the sandbox for code tasks;
- :mod:`gapo.exec.scoring` (with ``scoring_pool``): score a batch of completions with deadlines,
  in worker processes.

Imports point one way: ``gapo.tasks`` uses this package; nothing here imports ``gapo.tasks``.
"""
