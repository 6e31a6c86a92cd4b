"""The damage benchmark: AgentDojo's task suites under faults, three agent loops (README.md)."""
