"""A run's records in Parquet: what each rank writes as it runs (``writer``), their
schema (``schema``), reading them back as columns or as the event log's JSON Lines
(``reader``), and converting a run directory of JSON Lines logs (``convert``).
docs/records.md has the schema."""
