"""The state machine and the job shape: no I/O (the import contracts check it)."""
