"""Tools that read a run's logs after it ended: the log scanner, replay, explain, diff."""
