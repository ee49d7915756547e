"""The cluster around the ranks: ``run.run_cluster`` (one run from a ``RunSpec``), the
launcher (rank processes, torchrun), the thread transport, the collective guard and
watchdog, device selection, and faults."""
