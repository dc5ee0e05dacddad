"""Batches: many tasks cast on the fleet as seats free up (docs/fleet.md#batches)."""

#: a batch child's own exit statuses (batch/child.py), besides 0, 3 and 128+N:
#: a task saphan cannot run (nothing recorded), the store or a transport failed
#: before a run was made (the task is claimed again), and a claim no longer its own
EXIT_BAD_TASK, EXIT_RETRY, EXIT_CLAIM_GONE = 2, 69, 75
