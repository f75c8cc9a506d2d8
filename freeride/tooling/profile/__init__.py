"""`freeride profile`: a job's bubbles per stage and slot, the schedule's theory, and the what-if (docs/profile.md)."""
