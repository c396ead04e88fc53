"""The database layer: the only code that imports psycopg."""
