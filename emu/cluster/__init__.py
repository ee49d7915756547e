"""The cluster around the ranks: what ``run.run_cluster`` (one checked run) hosts them on,
the launcher (rank processes, torchrun), the thread transport, the collective guard and
watchdog, device selection, and faults."""
