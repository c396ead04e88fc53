"""pgqueue inside other frameworks: ``pgqueue.integrations.fastapi``."""
