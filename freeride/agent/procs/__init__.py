"""Worker processes: spawning and killing them, their cgroups, the records of their processes, their
task log files and the budget over all of them."""
