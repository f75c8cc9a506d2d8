"""The engine: the `Agent` front the servicers call, the task table, supervision (admission, worker start,
restart, the memory watchdog), retention, validation, Watch subscribers, the reference check. Uses the
control path, the state and the processes; no protobuf."""
