"""Plans: a whole plan of tool calls, validated, then run as a DAG."""
