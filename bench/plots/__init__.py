"""Charts and Markdown tables drawn from results/*.json."""
