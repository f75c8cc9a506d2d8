"""Side tasks that ship with freeride (submit them as `sidetasks.<module>:<Class>`)."""
