"""The worker runtime: the process the agent starts for each task (`python -m freeride.worker`).

It attaches to the agent, runs the task's steps in the windows the agent grants (the step gate, the
step-time estimate), checkpoints, and checks a task reference before the agent accepts it
(`python -m freeride.worker.check`). What side-task authors import stays in `freeride.sdk`; this
package may import the SDK, never the reverse, and imports nothing of the agent.
"""
