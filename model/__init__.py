"""GPT-2 and its pluggable inner attention."""
