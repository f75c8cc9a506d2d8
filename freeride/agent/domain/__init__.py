"""The agent's domain: tasks and counters, edges and worker messages, answers, timers, owned background
tasks, trainer streams. Imports nothing of the agent's other wings, and no protobuf."""
