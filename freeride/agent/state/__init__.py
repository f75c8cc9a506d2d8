"""What the agent keeps on disk: write-behind persistence, the SQLite registry, masked task secrets."""
