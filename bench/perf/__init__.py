"""Performance: what pgqueue costs, measured against PostgreSQL's own limits."""
