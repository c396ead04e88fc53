"""pgqueue against the other PostgreSQL queues, each in its own virtualenv."""
